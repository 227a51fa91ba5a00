//! Drift repair inside the DaemonSet's sandbox (`nodeplane::testing::lab::sandbox`; the
//! features' own sandboxed runs are in `kernel_dataplane::sandbox`): the monitor's
//! notifications and its own-socket check (`/proc/self/fd`) work there too.

use nodeplane::testing::lab::sandboxed;

#[test]
fn drift_repair_in_the_sandbox() {
    sandboxed(crate::drift::each_drift_is_repaired_at_once_and_other_tables_are_untouched);
}
