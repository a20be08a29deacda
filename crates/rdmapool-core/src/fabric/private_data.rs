//! Private data, as every connection manager and provider frames it: the limits per
//! message, and the two-byte frame (`0xA7`, length) that says where the data ends when RDMA
//! CM delivers it padded (docs/PROTOCOL.md). Public as `rdmapool::conn::*_private_data`.

use crate::{Error, Result};

/// Most private data a connection request carries (RDMA CM's 56 bytes less the frame).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 54;
/// Most private data an accept carries (RDMA CM's 196 bytes less the frame).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 194;
/// Most private data a reject carries (the InfiniBand CM REJ's 148 bytes less the frame).
pub const MAX_REJECT_PRIVATE_DATA: usize = 146;

/// First byte of framed private data: not ASCII, so text or a region descriptor ("RD..."),
/// sent unframed, is not mistaken for a frame.
const FRAME_MAGIC: u8 = 0xA7;

/// Frames application private data for RDMA CM: `0xA7, length (u8), data`. RDMA CM
/// delivers private data padded with zeros to a fixed size, so the length must travel with
/// it. A C peer frames its bytes the same way (docs/PROTOCOL.md).
///
/// ```
/// use rdmapool::conn::{decode_private_data, encode_private_data};
/// let framed = encode_private_data(b"hi").unwrap();
/// assert_eq!(framed, [0xA7, 2, b'h', b'i']);
/// let mut padded = framed.clone();
/// padded.resize(56, 0);                     // as RDMA CM delivers it
/// assert_eq!(decode_private_data(&padded).unwrap(), b"hi");
/// assert_eq!(decode_private_data(&[0; 56]).unwrap(), b"");  // a peer that sent nothing
/// assert!(decode_private_data(b"RDMA-unframed").is_err());
/// ```
pub fn encode_private_data(data: &[u8]) -> Result<Vec<u8>> {
    if data.len() > MAX_ACCEPT_PRIVATE_DATA {
        return Err(Error::OutOfLimits {
            what: "bytes of private data",
            value: data.len() as u64,
            min: 0,
            max: MAX_ACCEPT_PRIVATE_DATA as u64,
        });
    }
    let mut v = Vec::with_capacity(data.len() + 2);
    v.push(FRAME_MAGIC);
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    Ok(v)
}

/// Unframes private data made by [`encode_private_data`], as RDMA CM delivered it (zero
/// padding and all). Empty or all-zero bytes mean the peer sent none. Anything else that is
/// not a frame followed only by zeros is [`Error::BadPrivateData`], which carries the raw
/// bytes.
pub fn decode_private_data(raw: &[u8]) -> Result<&[u8]> {
    if raw.iter().all(|&b| b == 0) {
        return Ok(&[]);
    }
    let bad = |reason: String| Error::BadPrivateData {
        reason,
        raw: raw.to_vec(),
    };
    match raw {
        [FRAME_MAGIC, n, rest @ ..] if (*n as usize) <= rest.len() => {
            let (data, padding) = rest.split_at(*n as usize);
            if let Some(at) = padding.iter().position(|&b| b != 0) {
                return Err(bad(format!(
                    "{} bytes after the frame's {n} are not zero padding (byte {})",
                    padding.len(),
                    2 + *n as usize + at
                )));
            }
            Ok(data)
        }
        [FRAME_MAGIC, n, rest @ ..] => Err(bad(format!(
            "the frame says {n} bytes, {} arrived",
            rest.len()
        ))),
        _ => Err(bad(format!(
            "not framed (first byte {:#04x}, expected {FRAME_MAGIC:#04x}); the peer must send \
             0xa7, a length byte, then its data",
            raw[0]
        ))),
    }
}

/// Refuses private data longer than `max` bytes; `what` names it ("bytes of private data in
/// an accept").
#[doc(hidden)]
pub fn check_private(data: &[u8], max: usize, what: &'static str) -> Result<()> {
    if data.len() > max {
        return Err(Error::OutOfLimits {
            what,
            value: data.len() as u64,
            min: 0,
            max: max as u64,
        });
    }
    Ok(())
}
