//! `privmatch recover`: asks the coordinator to finish the distributed transactions a crash
//! left in doubt, and prints what it did (JSON).

use anyhow::Result;

use crate::cli::http::Coordinator;
use crate::config::Config;

/// `privmatch recover`.
pub async fn run(config: &Config) -> Result<()> {
    let answer: serde_json::Value = Coordinator::new(config)
        .post("/v1/recover", &serde_json::json!({}))
        .await?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}
