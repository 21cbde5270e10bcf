//! Running the `nft` binary: one transaction on its stdin (nftables JSON or `nft` syntax),
//! its stderr as the error; for the ARP guard ([`super::NftArpGuard`]) and the nftables
//! fence ([`super::fence`]).

use std::process::Stdio;

use nftables::schema::{NfCmd, NfObject, Nftables};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// How long one `nft` run may take before it is killed and reported as failed.
const NFT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `nft [args] -j -f -` with the batch on stdin; the error is `nft`'s stderr (or why
/// it could not run).
pub(crate) async fn run_nft(
    nft: &std::path::Path,
    args: &[&str],
    batch: &NftBatch,
) -> Result<(), String> {
    let input = batch.to_json();
    run_nft_input(nft, args, true, move || input).await
}

/// How often a run whose `nft` binary is busy (`ETXTBSY`) is tried again, [`NFT_BUSY_PAUSE`]
/// apart.
const NFT_BUSY_RETRIES: u32 = 5;
/// A pipe's default capacity (Linux: 16 pages of 4 KiB).
const PIPE_DEFAULT: usize = 65536;
/// Pause before trying a busy `nft` binary again.
const NFT_BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Runs `nft [args] [-j] -f -` with `input()` on stdin (`json`: nftables JSON, else `nft`
/// syntax), `input` called once `nft` has started; the error is `nft`'s stderr (or why it
/// could not run).
async fn run_nft_input(
    nft: &std::path::Path,
    args: &[&str],
    json: bool,
    input: impl FnOnce() -> String + Send,
) -> Result<(), String> {
    // ETXTBSY: the binary is open for writing somewhere (being replaced by a package
    // upgrade, or a stand-in just written while another thread forked); it passes.
    let mut busy = 0;
    let mut child = loop {
        let spawned = tokio::process::Command::new(nft)
            .args(args)
            .args(if json {
                &["-j", "-f", "-"][..]
            } else {
                &["-f", "-"][..]
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && busy < NFT_BUSY_RETRIES => {
                busy += 1;
                tokio::time::sleep(NFT_BUSY_PAUSE).await;
            }
            r => {
                break r.map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => format!(
                        "{} not found (install the nftables package, which provides nft)",
                        nft.display()
                    ),
                    _ => format!("cannot run {}: {e}", nft.display()),
                })?;
            }
        }
    };
    let input = input();
    if let Some(stdin) = child.stdin.as_ref()
        && input.len() > PIPE_DEFAULT
    {
        // One write(2) for the whole input: a partial write would let `nft` wait for the
        // rest while this process is frozen, and commit timeouts written before the freeze
        // after it. Best effort: the kernel caps it at fs.pipe-max-size (1 MiB by default).
        let _ = nix::fcntl::fcntl(
            stdin,
            nix::fcntl::FcntlArg::F_SETPIPE_SZ(
                nix::libc::c_int::try_from(input.len()).unwrap_or(nix::libc::c_int::MAX),
            ),
        );
    }
    let run = async move {
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .await
                .map_err(|e| format!("writing to {}: {e}", nft.display()))?;
        }
        child
            .wait_with_output()
            .await
            .map_err(|e| format!("waiting for {}: {e}", nft.display()))
    };
    let out = tokio::time::timeout(NFT_TIMEOUT, run)
        .await
        .map_err(|_| format!("{} did not finish within {NFT_TIMEOUT:?}", nft.display()))??;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    Err(if stderr.is_empty() {
        format!("{} exited with {}", nft.display(), out.status)
    } else {
        stderr
    })
}

/// One atomic `nft` transaction: the JSON sent to `nft -j -f -` and the same commands in
/// `nft` syntax (for logs and errors).
#[derive(Debug, Clone, PartialEq)]
pub struct NftBatch {
    /// The commands, in order.
    pub objects: Vec<NfObject<'static>>,
    /// The commands in `nft` syntax, in the same order.
    pub text: Vec<String>,
}

impl NftBatch {
    /// An empty transaction.
    pub(crate) fn new() -> Self {
        NftBatch {
            objects: Vec::new(),
            text: Vec::new(),
        }
    }

    /// Appends `cmd`, written `text` in `nft` syntax.
    pub(crate) fn push(&mut self, cmd: NfCmd<'static>, text: String) {
        self.objects.push(NfObject::CmdObject(cmd));
        self.text.push(text);
    }

    /// The batch as nftables JSON (`{"nftables": [...]}`).
    pub fn to_json(&self) -> String {
        let doc = Nftables {
            objects: std::borrow::Cow::Owned(self.objects.clone()),
        };
        // Serialising these plain data types cannot fail; keep an empty batch otherwise.
        serde_json::to_string(&doc).unwrap_or_else(|_| r#"{"nftables":[]}"#.to_string())
    }

    /// The commands in `nft` syntax, joined with `; `.
    pub fn command(&self) -> String {
        self.text.join("; ")
    }
}
