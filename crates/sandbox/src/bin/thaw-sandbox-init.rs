//! The small sandbox init: what `thaw_sandbox::default_init` picks when it sits next to
//! the spawning program and comes from the same build (`--build-id` tells).

fn main() {
    if std::env::args().nth(1).as_deref() == Some(thaw_sandbox::init_exe::BUILD_ID_ARG) {
        println!("{}", thaw_sandbox::init_exe::BUILD_ID);
        return;
    }
    thaw_sandbox::sandbox_init_main()
}
