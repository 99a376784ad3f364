//! Whole-file reads (`read_file_bytes`, `read_file`, `tar_out_bytes`) hold at most
//! `MAX_WHOLE_READ` bytes on the host: a larger file is a clear error, not a host-sized
//! buffer.

mod common;

use common::{Mode, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_file_read_past_the_cap_fails_clearly_and_one_at_the_cap_is_read_whole() {
    use omabox_agent::{ClientError, MAX_WHOLE_READ};
    let h = start(Mode::Child).await;
    let path = h.path("big");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(MAX_WHOLE_READ as u64 + 1).unwrap(); // sparse: no disk, no host memory
    let error = h.client.read_file_bytes(&path).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::TooLarge { limit, .. } if *limit == MAX_WHOLE_READ),
        "{error}"
    );
    assert!(error.to_string().contains("stream it instead"), "{error}");
    // The connection is fine afterwards, and a file at the cap is read whole.
    file.set_len(MAX_WHOLE_READ as u64).unwrap();
    assert_eq!(
        h.client.read_file_bytes(&path).await.unwrap().len(),
        MAX_WHOLE_READ
    );
}

/// A fifo with no writer (opening it would block forever) or a device that never ends
/// (`/dev/zero`) is not read: only regular files are, and the refusal is immediate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_regular_files_are_read() {
    use omabox_agent::ErrorKind;
    let h = start(Mode::Child).await;
    let fifo = h.path("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    for path in [fifo.as_str(), "/dev/zero"] {
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(20), h.client.open_file(path))
                .await
                .expect("refused at once, not blocked");
        let error = read.unwrap_err();
        assert_eq!(
            error.remote_kind(),
            Some(ErrorKind::InvalidRequest),
            "{error}"
        );
        assert!(error.to_string().contains("not a regular file"), "{error}");
    }
}
