//! A private certificate authority for TLS tests, made with `openssl`
//! (Debian's package of that name, installed by
//! `scripts/install-services.sh`): a CA, a server certificate for
//! `127.0.0.1` and `localhost` signed by it, and a client certificate.

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::process::{ServerError, run_tool};

/// The files of a private CA in a temporary directory, removed on drop:
/// `ca.crt`, `server.crt`/`server.key` (valid for `127.0.0.1` and
/// `localhost`) and `client.crt`/`client.key`, all PEM.
#[derive(Debug)]
pub struct TestCerts {
    dir: TempDir,
}

impl TestCerts {
    /// Makes the CA and both certificates (valid for two days).
    pub fn generate() -> Result<TestCerts, ServerError> {
        let dir = tempfile::tempdir().map_err(|e| ServerError::Io {
            what: "create a directory for test certificates".into(),
            source: e,
        })?;
        let d = dir.path();
        // Extensions make version-3 certificates (webpki refuses others).
        for (file, text) in [
            (
                "server.ext",
                "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
            ),
            (
                "client.ext",
                "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
            ),
        ] {
            std::fs::write(d.join(file), text).map_err(|e| ServerError::Io {
                what: format!("write {file}"),
                source: e,
            })?;
        }
        let ca = [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=lockkit test CA",
        ];
        openssl(d, &ca)?;
        for who in ["server", "client"] {
            let (key, csr, crt, ext) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
                format!("{who}.ext"),
            );
            let subject = format!("/CN={who}");
            openssl(
                d,
                &[
                    "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                    &subject,
                ],
            )?;
            let sign = [
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ];
            openssl(d, &sign)?;
        }
        Ok(TestCerts { dir })
    }

    /// The path of one of the files (`ca.crt`, `server.key`, …).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `ca.crt`.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.crt")
    }
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), ServerError> {
    let mut command = Command::new("openssl");
    command.args(args).current_dir(dir);
    run_tool(
        &format!("openssl {args:?}"),
        &mut command,
        "scripts/install-services.sh installs it",
    )
}
