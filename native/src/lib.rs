//! distprof's native decoder (issue 24). Skeleton: every run falls back to the Python path.
#[no_mangle]
pub extern "C" fn dp_abi_version() -> u32 {
    1
}
