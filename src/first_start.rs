//! What the first start hands the operator: the `admin` console password and the demo's API
//! token. On a terminal they are printed. Otherwise stdout usually goes to a log store (a
//! service manager's journal, a container's log), where anyone who reads the logs would find
//! them: they are written to a file in the data directory instead, created readable by its
//! owner only, and the log says where (not what).

use std::fs::{DirBuilder, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The file's name in the data directory.
pub const FILE: &str = "first-start-credentials.txt";

/// Shows `text` on the terminal, or appends it to the data directory's credentials file
/// (creating the directory when there is none yet, as with an external database).
pub fn hand_over(data_dir: &Path, text: &str) -> anyhow::Result<()> {
    if std::io::stdout().is_terminal() {
        print!("{text}");
        return Ok(());
    }
    let path = write(data_dir, text).with_context(|| {
        format!(
            "stdout is not a terminal, so the first start's credentials go to a file, but it cannot be written in {}: \
             set CHIME_DATA_DIR to a directory chime can write, or run the first start on a terminal",
            data_dir.display()
        )
    })?;
    tracing::info!("the first start's credentials (console password, API token) are in {}, readable by its owner only", path.display());
    Ok(())
}

fn write(data_dir: &Path, text: &str) -> anyhow::Result<PathBuf> {
    DirBuilder::new().recursive(true).mode(0o700).create(data_dir)?;
    let path = data_dir.join(FILE);
    // The mode applies when the file is created; one left by an earlier first start keeps its own.
    let mut file = OpenOptions::new().create(true).append(true).mode(0o600).open(&path)?;
    let mode = file.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        anyhow::bail!("{} is readable by others (mode {:o}): remove it, or make it the owner's only (chmod 600)", path.display(), mode & 0o777);
    }
    file.write_all(format!("# chime's first start, {}\n{text}", chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC")).as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_created_for_its_owner_only_and_a_shared_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("chime-first-start-{}", uuid::Uuid::new_v4()));
        let path = write(&dir.join("data"), "password: x\n").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(dir.join("data")).unwrap().permissions().mode() & 0o777, 0o700);
        write(&dir.join("data"), "token: y\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("password: x\n") && text.ends_with("token: y\n"), "{text}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = write(&dir.join("data"), "z\n").unwrap_err().to_string();
        assert!(e.contains("readable by others (mode 644)"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
