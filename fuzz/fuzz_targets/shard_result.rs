//! `probe merge`'s inputs: a shard result's `shard.json`, `units.msgpack` and a part of
//! its `rows.msgpack` (shard folders copied around a cluster).
#![no_main]

use libfuzzer_sys::fuzz_target;
use probe::compare::{shard, tables};

fuzz_target!(|data: &[u8]| {
    for e in [
        shard::parse_header(data).err(),
        shard::parse_units(data).err(),
        tables::parse_rows(data).err().map(|e| e.to_string()),
    ]
    .into_iter()
    .flatten()
    {
        assert!(!e.contains('\n'), "{e}");
    }
});
