//! safetensors shard headers, as `Shard::open` parses them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = probe::tensor::ShardIndex::parse(data) {
        assert!(!e.contains('\n'), "{e:?}");
    }
});
