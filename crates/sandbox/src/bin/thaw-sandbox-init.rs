//! Sandbox init for tests and deployments that do not re-exec their own binary.

fn main() {
    thaw_sandbox::sandbox_init_main()
}
