//! `privmatch face seal`: enrolments and probes quantised, shared and sealed here, to the
//! pinned keys of P0 and P1, and written as sealed inputs for the SQL front door
//! (`privmatch.face_enroll`, `privmatch.face_verify`, `privmatch.face_identify`) instead of
//! being sent. Nothing is contacted: sealing needs only the configuration's pinned keys.
//!
//! A probe's reply key (docs/protocols/face.md §13) is the static public key of the party
//! whose front door will be called (`--front-door`, pinned in this configuration): P0 and P1
//! seal their outputs to it, and that party opens them with its key file. The coordinator
//! relays them unread.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::face::enroll::{seal_face_enrollment, FaceEnrollRequest, FACE_ENROLL_PURPOSE};
use privmatch_core::face::probe::{seal_face_probe, FACE_PROBE_PURPOSE};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::sealed_input::SealedKind;
use privmatch_core::wire::session::new_session_id;

use crate::cli::keys::Sealer;
use crate::cli::ndjson::for_each_line;
use crate::cli::sealed::{report, SealedWriter};
use crate::config::Config;
use crate::face::input::{
    parse_enroll_line, read_enroll_file, read_probe_file, EmbeddingOptions, FaceEnrollRecord,
};
use privmatch_api::face::{FaceEnrollBody, FaceIdentifyBody, FaceVerifyBody};
use privmatch_api::wire::{session_to_hex, to_base64};

/// Options of `privmatch face seal`.
#[derive(Args, Clone, Debug)]
pub struct FaceSealArgs {
    /// What the inputs are for: `enroll` (privmatch.face_enroll) and `verify`
    /// (privmatch.face_verify; the claimed subject is each line's) take lines
    /// {"subject": "...", "embedding": [floats]}; `identify` (privmatch.face_identify) takes
    /// {"embedding": [floats]}.
    #[arg(long = "for", value_parser = ["enroll", "verify", "identify"])]
    pub purpose: String,
    /// NDJSON input file.
    #[arg(long)]
    pub input: PathBuf,
    /// Output file (default: standard output): `<subject>\t<sealed input>` per record.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// L2-normalise each embedding before quantising it (for the cosine metric).
    #[arg(long)]
    pub normalize: bool,
    /// Verify and identify: the party (0, 1 or 2) whose SQL front door the application will
    /// call. P0 and P1 seal the result to that party's pinned key; only it can open it.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub front_door: Option<u8>,
}

/// Runs `privmatch face seal`.
pub fn run(config: &Config, args: &FaceSealArgs) -> Result<()> {
    let mut sealer = Sealer::new(config)?;
    let options = EmbeddingOptions {
        normalize: args.normalize,
    };
    let reply_key = match (args.purpose.as_str(), args.front_door) {
        ("enroll", None) => None,
        ("enroll", Some(_)) => bail!("--front-door is for probes (--for verify or identify)"),
        (_, None) => bail!(
            "--front-door is required with --for {}: the party (0, 1 or 2) whose SQL front door will be called, which opens the result",
            args.purpose
        ),
        (_, Some(party)) => Some(sealer.keys[usize::from(party)]),
    };
    let mut out = SealedWriter::create(args.out.as_deref())?;
    let kind = match args.purpose.as_str() {
        "enroll" => {
            for record in read_enroll_file(&args.input, options)? {
                let body = enroll_body(&mut sealer, &record)?;
                out.write_json(&record.subject, SealedKind::FaceEnroll, &body)?;
            }
            SealedKind::FaceEnroll
        }
        "verify" => {
            // Claims may repeat a subject, so lines are parsed one by one (no duplicate check).
            let mut dim = None;
            for_each_line(&args.input, |number, text| {
                let record = parse_enroll_line(number, text, dim, options)?;
                dim = Some(record.embedding.len());
                let (session, probes) = seal_probe(
                    &mut sealer,
                    &record.embedding,
                    Some(&record.subject),
                    &reply_key,
                )?;
                // The subject is sealed inside the probes; the body (which the coordinator
                // receives) names none. The output line keeps it for the application.
                let body = FaceVerifyBody {
                    session,
                    probes,
                    subject: None,
                };
                out.write_json(&record.subject, SealedKind::FaceVerify, &body)
            })?;
            SealedKind::FaceVerify
        }
        _ => {
            for probe in read_probe_file(&args.input, options)? {
                let (session, probes) = seal_probe(&mut sealer, &probe.embedding, None, &reply_key)
                    .map_err(|e| anyhow!("line {}: {e}", probe.line))?;
                out.write_json(
                    "",
                    SealedKind::FaceIdentify,
                    &FaceIdentifyBody { session, probes },
                )?;
            }
            SealedKind::FaceIdentify
        }
    };
    let written = out.finish()?;
    report(written, kind, args.out.as_deref());
    Ok(())
}

/// One record's enrolment body (`on_duplicate` skip: a retried call reports it enrolled), its
/// envelopes signed for P0 and P1 by the configured client, if any.
fn enroll_body(sealer: &mut Sealer, record: &FaceEnrollRecord) -> Result<FaceEnrollBody> {
    let request = FaceEnrollRequest {
        subject: &record.subject,
        embedding: &record.embedding,
    };
    let (sealed, _) = seal_face_enrollment(&[request], &sealer.keys, &mut sealer.rng)
        .map_err(|e| anyhow!("line {}: sealing: {e}", record.line))?;
    let [e0, e1] = sealer.sign_each(FACE_ENROLL_PURPOSE, sealed);
    Ok(FaceEnrollBody {
        on_duplicate: "skip".into(),
        envelopes: [to_base64(&e0), to_base64(&e1)],
    })
}

/// A probe sealed to P0 and P1 for a fresh session (bound to `subject` for a verification),
/// with the front-door party's key as its reply key.
fn seal_probe(
    sealer: &mut Sealer,
    embedding: &[i32],
    subject: Option<&str>,
    reply_key: &Option<PartyPublicKey>,
) -> Result<(String, [String; 2])> {
    let reply_key = reply_key.ok_or_else(|| anyhow!("no front-door party"))?;
    let session = new_session_id(&mut rand::rngs::OsRng);
    let sealed = seal_face_probe(
        embedding,
        session,
        subject,
        &reply_key,
        &sealer.keys,
        &mut sealer.rng,
    )
    .map_err(|e| anyhow!("sealing the probe: {e}"))?;
    let [p0, p1] = sealed;
    let signed = [
        sealer.sign_for(PartyIndex::ALL[0], FACE_PROBE_PURPOSE, p0),
        sealer.sign_for(PartyIndex::ALL[1], FACE_PROBE_PURPOSE, p1),
    ];
    Ok((session_to_hex(&session), signed.map(|p| to_base64(&p))))
}
