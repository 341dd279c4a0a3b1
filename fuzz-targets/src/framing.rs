use capnp::message::ReaderSegments;

/// Reads `bytes` as a connection reads its stream
/// ([`bitfold_net::framing::read_message`]): message after message, each
/// into a buffer of its own, until the stream ends cleanly or a message is
/// refused. The segments of every message read, and the error that stopped
/// the reading, if one did.
fn read_stream(bytes: &[u8]) -> (Vec<Vec<Vec<u8>>>, Option<capnp::Error>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime without drivers starts");
    runtime.block_on(async {
        let mut stream = bytes;
        let mut messages = Vec::new();
        loop {
            let options = bitfold_proto::reader_options();
            match bitfold_net::framing::read_message(&mut stream, options).await {
                Ok(Some(message)) => {
                    let segments = message.into_segments();
                    messages.push(
                        (0..)
                            .map_while(|id| segments.get_segment(id).map(<[u8]>::to_vec))
                            .collect(),
                    );
                }
                Ok(None) => return (messages, None),
                Err(err) => return (messages, Some(err)),
            }
        }
    })
}

/// A connection's reading of its stream into messages
/// (`rpc/net/src/framing.rs`), against Cap'n Proto's own stream reader with
/// the same limits: message after message, both read the same segments,
/// and both stop at the same message, at a clean end or refusing it (the
/// refusals' words differ). Where the stream stops inside a message whose
/// table announces more words than follow it, the connection's reader
/// must report the stream cut short; Cap'n Proto's is not asked, as it
/// would first zero every word announced (up to 1 GiB).
pub fn framing(data: &[u8]) {
    let (messages, stopped) = read_stream(data);
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(bitfold_proto::MAX_MESSAGE_WORDS));
    let mut stream = data;
    for (i, segments) in messages.iter().enumerate() {
        let theirs = capnp::serialize::try_read_message(&mut stream, options)
            .unwrap_or_else(|err| panic!("message {i} read, which capnp refuses: {err}"))
            .unwrap_or_else(|| panic!("message {i} read past what capnp sees as the end"));
        let theirs = theirs.into_segments();
        assert_eq!(theirs.len(), segments.len(), "segments of message {i}");
        for (id, segment) in segments.iter().enumerate() {
            let expected = theirs
                .get_segment(id as u32)
                .expect("a segment capnp counted");
            assert!(segment[..] == *expected, "segment {id} of message {i}");
        }
    }
    if cut_short(stream) {
        let err = stopped.expect("a message longer than the stream is refused");
        assert_eq!(err.kind, capnp::ErrorKind::PrematureEndOfFile, "{err}");
        return;
    }
    match (
        stopped,
        capnp::serialize::try_read_message(&mut stream, options),
    ) {
        (None, Ok(None)) | (Some(_), Err(_)) => {}
        (None, theirs) => panic!(
            "a clean end where capnp reads {:?}",
            theirs.map(|m| m.is_some())
        ),
        (Some(ours), Ok(_)) => panic!("refused a message capnp reads: {ours}"),
    }
}

/// Whether `stream` begins with a whole segment table, within the limits,
/// announcing more words than follow it.
fn cut_short(stream: &[u8]) -> bool {
    let word = |at: usize| -> Option<u64> {
        let bytes = stream.get(at..at + 4)?;
        Some(u64::from(u32::from_le_bytes(bytes.try_into().ok()?)))
    };
    let Some(count) = word(0).map(|n| n + 1) else {
        return false;
    };
    if count >= 512 {
        return false;
    }
    let table = (4 + 4 * count).next_multiple_of(8) as usize;
    let Some(words) = (0..count as usize)
        .map(|i| word(4 + 4 * i))
        .sum::<Option<u64>>()
    else {
        return false;
    };
    stream.len() >= table
        && words <= bitfold_proto::MAX_MESSAGE_WORDS as u64
        && ((stream.len() - table) as u64) < words * 8
}
