//! The systems measured, behind one interface: the store (a `Store` client), Redis (a
//! `redis`-crate connection: GET, SET, DEL) and memcached (`memcached_ref`); and how one
//! request of a YCSB workload or of a trace runs on any of them.

use super::trace::{Trace, TraceOp, TraceRequest};
use super::workload::{key, Op, Request};
use crate::bench::store::redis_ref::redis_err;
use crate::{Result, ToolError};
use rdmapool::store::Store;
use redis::Commands;

/// A key-value system as a bench client uses it: one connection (or store client), used by
/// one thread.
pub(super) trait Kv {
    /// The system's name, for errors.
    fn name(&self) -> &'static str;
    /// Reads `key` into `value`; false when it has none.
    fn get(&mut self, key: &[u8], value: &mut Vec<u8>) -> Result<bool>;
    /// Writes `value` to `key`.
    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Removes `key` (absent or not).
    fn delete(&mut self, key: &[u8]) -> Result<()>;
}

/// A store client putting `replicas` copies.
pub(super) struct StoreKv<'a> {
    /// The client.
    pub(super) store: &'a Store,
    /// Copies per put.
    pub(super) replicas: usize,
}

impl Kv for StoreKv<'_> {
    fn name(&self) -> &'static str {
        "the store"
    }

    fn get(&mut self, key: &[u8], value: &mut Vec<u8>) -> Result<bool> {
        match self.store.block_on(self.store.get(key))? {
            Some(v) => {
                *value = v;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.store
            .block_on(self.store.put_with(key, value, self.replicas))?;
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.store.block_on(self.store.remove(key))?;
        Ok(())
    }
}

/// One Redis connection.
pub(super) struct RedisKv(pub(super) redis::Connection);

impl Kv for RedisKv {
    fn name(&self) -> &'static str {
        "redis-server"
    }

    fn get(&mut self, key: &[u8], value: &mut Vec<u8>) -> Result<bool> {
        let got: Option<Vec<u8>> = self.0.get(key).map_err(redis_err)?;
        match got {
            Some(v) => {
                *value = v;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.0.set::<_, _, ()>(key, value).map_err(redis_err)
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.0.del::<_, ()>(key).map_err(redis_err)
    }
}

/// A client's buffers: the value it writes and the one it reads.
pub(super) struct Scratch {
    /// What puts write (its first 8 bytes stamped with the record's number).
    value: Vec<u8>,
    /// What gets read.
    read: Vec<u8>,
}

impl Scratch {
    /// Buffers for values of up to `size` bytes.
    pub(super) fn new(size: usize) -> Self {
        Self {
            value: (0..size).map(|i| (i * 131 % 251) as u8).collect(),
            read: Vec::with_capacity(size),
        }
    }
}

/// Runs one YCSB request on `kv` with records of `size` bytes (the scratch's). A read that
/// finds no record, or one of another size, is an error: every record read was loaded or
/// inserted before.
pub(super) fn ycsb_request<K: Kv>(kv: &mut K, req: Request, s: &mut Scratch) -> Result<()> {
    let name = key(req.record);
    let k = name.as_bytes();
    let size = s.value.len();
    let read = |kv: &mut K, s: &mut Scratch| -> Result<()> {
        if !Kv::get(kv, k, &mut s.read)? || s.read.len() != size {
            return Err(ToolError::Msg(format!(
                "bench ycsb: {} has no record {name} of {size} bytes, which was written before",
                kv.name()
            )));
        }
        Ok(())
    };
    match req.op {
        Op::Read => read(kv, s),
        Op::Update | Op::Insert => {
            let stamp = req.record.to_le_bytes();
            let n = stamp.len().min(size);
            s.value[..n].copy_from_slice(&stamp[..n]);
            kv.set(k, &s.value)
        }
        Op::ReadModifyWrite => {
            read(kv, s)?;
            if let Some(b) = s.read.last_mut() {
                *b = b.wrapping_add(1);
            }
            kv.set(k, &s.read)
        }
    }
}

/// Runs one trace request on `kv`: a get that misses sets the key to the request's size.
/// The scratch holds values of the trace's largest size.
pub(super) fn trace_request(
    kv: &mut impl Kv,
    trace: &Trace,
    req: &TraceRequest,
    s: &mut Scratch,
) -> Result<()> {
    let k = trace.key(req.key);
    let size = (req.size as usize).min(s.value.len());
    match req.op {
        TraceOp::Get => {
            if !kv.get(k, &mut s.read)? {
                kv.set(k, &s.value[..size])?;
            }
            Ok(())
        }
        TraceOp::Set => kv.set(k, &s.value[..size]),
        TraceOp::Delete => kv.delete(k),
    }
}

/// Runs one get of a hit-rate run on `kv` (`hit.rs`): record `record`'s key, and on a miss
/// a set of the record (a look-aside cache's miss fill), stamped with its number. Returns
/// whether the get hit. A hit that returns another size or another record's stamp is an
/// error: a cache may lose a record, never answer a wrong one.
pub(super) fn hit_request<K: Kv>(kv: &mut K, record: u64, s: &mut Scratch) -> Result<bool> {
    let name = key(record);
    let k = name.as_bytes();
    let size = s.value.len();
    let stamp = record.to_le_bytes();
    let n = stamp.len().min(size);
    if kv.get(k, &mut s.read)? {
        if s.read.len() != size || s.read[..n] != stamp[..n] {
            return Err(ToolError::Msg(format!(
                "bench ycsb --hit-rate: {} answered {name} with a value of {} bytes that is not \
                 the record's ({size} bytes stamped {record})",
                kv.name(),
                s.read.len()
            )));
        }
        return Ok(true);
    }
    s.value[..n].copy_from_slice(&stamp[..n]);
    kv.set(k, &s.value)?;
    Ok(false)
}
