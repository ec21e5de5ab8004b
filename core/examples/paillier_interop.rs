//! Paillier interoperability driver for `tests/python/test_phe_interop.py`: reads one JSON
//! object on stdin — the primes of a key made by python-paillier (`phe`), (m, r) pairs to
//! encrypt, and ciphertexts `phe` made to decrypt — and prints what this crate computes, so the
//! Python test can compare byte for byte. Integers travel as decimal strings.
//!
//! Input:  `{"p": "…", "q": "…", "encrypt": [{"m": "…", "r": "…"}], "decrypt": ["…"]}`
//! Output: `{"n": "…", "ciphertexts": ["…"], "owner_ciphertexts": ["…"], "plaintexts": ["…"]}`

use privmatch_core::paillier::cipher::SecretKey;
use rug::Integer;
use std::io::Read;

fn integer(v: &serde_json::Value, what: &str) -> Result<Integer, String> {
    let s = v
        .as_str()
        .ok_or_else(|| format!("{what}: expected a decimal string"))?;
    Integer::from_str_radix(s, 10).map_err(|e| format!("{what}: {e}"))
}

fn run() -> Result<serde_json::Value, String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("stdin: {e}"))?;
    let json: serde_json::Value = serde_json::from_str(&input).map_err(|e| format!("JSON: {e}"))?;
    let p = integer(&json["p"], "p")?;
    let q = integer(&json["q"], "q")?;
    let sk = SecretKey::from_primes(p, q).map_err(|e| e.to_string())?;
    let pk = sk.public_key();
    let mut ciphertexts = Vec::new();
    let mut owner_ciphertexts = Vec::new();
    for case in json["encrypt"]
        .as_array()
        .ok_or("encrypt: expected an array")?
    {
        let m = integer(&case["m"], "m")?;
        let r = integer(&case["r"], "r")?;
        let c = pk.encrypt_with(&m, &r).map_err(|e| e.to_string())?;
        ciphertexts.push(c.as_integer().to_string());
        let c = sk.encrypt_with(&m, &r).map_err(|e| e.to_string())?;
        owner_ciphertexts.push(c.as_integer().to_string());
    }
    let mut plaintexts = Vec::new();
    for c in json["decrypt"]
        .as_array()
        .ok_or("decrypt: expected an array")?
    {
        let c = pk
            .ciphertext_from_integer(integer(c, "ciphertext")?)
            .map_err(|e| e.to_string())?;
        plaintexts.push(sk.decrypt(&c).to_string());
    }
    Ok(serde_json::json!({
        "n": pk.n().to_string(),
        "ciphertexts": ciphertexts,
        "owner_ciphertexts": owner_ciphertexts,
        "plaintexts": plaintexts,
    }))
}

fn main() {
    match run() {
        Ok(out) => println!("{out}"),
        Err(e) => {
            eprintln!("paillier_interop: {e}");
            std::process::exit(2);
        }
    }
}
