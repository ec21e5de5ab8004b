//! Writes the table of error codes into docs/front-door.md from privmatch-api's `ErrorCode`
//! (between the generated table's markers). Run: `cargo run -p privmatch-api --example
//! error-table`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/front-door.md");
    let doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(generated) = privmatch_api::error::with_generated_table(&doc) else {
        eprintln!(
            "{path} lacks the markers:\n{}\n{}",
            privmatch_api::error::TABLE_BEGIN,
            privmatch_api::error::TABLE_END
        );
        return ExitCode::FAILURE;
    };
    if let Err(e) = std::fs::write(path, generated) {
        eprintln!("cannot write {path}: {e}");
        return ExitCode::FAILURE;
    }
    println!("wrote the error table into {path}");
    ExitCode::SUCCESS
}
