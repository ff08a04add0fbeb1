//! `vmtest-relay HOST:PORT`: the program qemu runs for each guest connection
//! to a host forward (see `vmtest::relay`). Kept apart from the `vmtest`
//! binary so that it starts fast (one process per connection) and so that
//! test harnesses linking the library can find it beside their executable.

fn main() -> std::process::ExitCode {
    vmtest::relay::main()
}
