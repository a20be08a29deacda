//! Work completions.

use std::fmt;

/// Completion status, numbered exactly as `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// All statuses, in numeric order.
    pub const ALL: [WcStatus; 22] = [
        Self::Success,
        Self::LocLenErr,
        Self::LocQpOpErr,
        Self::LocEecOpErr,
        Self::LocProtErr,
        Self::WrFlushErr,
        Self::MwBindErr,
        Self::BadRespErr,
        Self::LocAccessErr,
        Self::RemInvReqErr,
        Self::RemAccessErr,
        Self::RemOpErr,
        Self::RetryExcErr,
        Self::RnrRetryExcErr,
        Self::LocRddViolErr,
        Self::RemInvRdReqErr,
        Self::RemAbortErr,
        Self::InvEecnErr,
        Self::InvEecStateErr,
        Self::FatalErr,
        Self::RespTimeoutErr,
        Self::GeneralErr,
    ];

    /// The status with this `ibv_wc_status` number, if any.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// The text `ibv_wc_status_str` gives for this status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocEecOpErr => "local EE context operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::MwBindErr => "memory management operation error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::LocRddViolErr => "local RDD violation error",
            Self::RemInvRdReqErr => "remote invalid RD request",
            Self::RemAbortErr => "aborted error",
            Self::InvEecnErr => "invalid EE context number",
            Self::InvEecStateErr => "invalid EE context state",
            Self::FatalErr => "fatal error",
            Self::RespTimeoutErr => "response timeout error",
            Self::GeneralErr => "general error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of work completed, mirroring `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND completed.
    Send,
    /// An RDMA WRITE (with or without immediate) completed.
    RdmaWrite,
    /// An RDMA READ completed.
    RdmaRead,
    /// A compare-and-swap completed.
    CompSwap,
    /// A fetch-and-add completed.
    FetchAdd,
    /// A RECV consumed an incoming SEND.
    Recv,
    /// A RECV consumed an incoming RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// A memory window was bound ([`crate::fabric::Qp::post_bind_mw`]).
    BindMw,
    /// A remote key was invalidated ([`crate::fabric::WrOp::LocalInvalidate`]).
    LocalInv,
}

/// One work completion: the outcome of one work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's id from the work request.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed. For error completions this is the opcode of the posted request.
    pub opcode: WcOpcode,
    /// Bytes transferred (for receives: bytes placed in the buffer; for WRITE with immediate:
    /// the length of the write).
    pub byte_len: u32,
    /// Immediate data carried by SEND or WRITE with immediate.
    pub imm: Option<u32>,
    /// The local QP the work request was posted on.
    pub qp_num: u32,
}

impl Completion {
    /// A placeholder for the slots of a poll buffer: `[Completion::EMPTY; 16]`.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: WcStatus::GeneralErr,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
    };

    /// True when the status is [`WcStatus::Success`].
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}
