//! The binary: everything, from the held stop signals to the exit code, is
//! `pg_storage_exporter::entry::main`.

#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    pg_storage_exporter::entry::main()
}
