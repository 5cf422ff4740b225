//! Build and test automation for the workspace.

fn main() {
    eprintln!("xtask: not implemented yet");
    std::process::exit(2);
}
