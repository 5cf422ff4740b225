//! `ipvs-proxier`: the daemon. Not implemented yet.

fn main() {
    eprintln!("ipvs-proxier: the daemon is not implemented yet");
    std::process::exit(2);
}
