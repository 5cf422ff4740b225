use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

use super::*;

/// A payload of fixed bytes with a fixed message type.
#[derive(Debug)]
struct Bytes(u16, &'static [u8]);

impl NetlinkSerializable for Bytes {
    fn message_type(&self) -> u16 {
        self.0
    }

    fn buffer_len(&self) -> usize {
        self.1.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(self.1);
    }
}

#[test]
fn request_header_layout() {
    // A genl request: nlmsghdr (len 20, type 0x1c, flags REQUEST|ACK, seq 7, port 0), then
    // genlmsghdr (cmd 17, version 1).
    let bytes = encode(Bytes(0x1c, &[17, 1, 0, 0]), NLM_F_REQUEST | NLM_F_ACK, 7);
    let expected: [u8; 20] = [
        20, 0, 0, 0, 0x1c, 0, 5, 0, 7, 0, 0, 0, 0, 0, 0, 0, 17, 1, 0, 0,
    ];
    assert_eq!(bytes, expected);
}

#[test]
fn messages_are_padded_to_four_bytes_in_a_datagram() {
    let mut buf = Vec::new();
    push_message(&mut buf, Bytes(0x20, &[1, 2, 3, 4, 5]), NLM_F_REQUEST, 1);
    push_message(&mut buf, Bytes(0x21, &[9]), NLM_F_REQUEST | NLM_F_DUMP, 2);
    // 16 + 5 = 21, padded to 24; the header keeps the unpadded length.
    assert_eq!(buf.len(), 24 + 20);
    assert_eq!(buf[0], 21);
    let parsed: Vec<_> = replies(&buf).collect();
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[0].payload, &[1, 2, 3, 4, 5]);
    assert_eq!(parsed[1].header.message_type, 0x21);
    assert_eq!(parsed[1].header.flags, NLM_F_REQUEST | NLM_F_DUMP);
    assert_eq!(parsed[1].header.sequence_number, 2);
    assert_eq!(parsed[1].payload, &[9]);
}

/// An `NLMSG_ERROR` for `sequence` with `code` (capped: the echoed header only).
fn error_message(sequence: u32, code: i32) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&36u32.to_ne_bytes());
    bytes.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
    bytes.extend_from_slice(&0x100u16.to_ne_bytes()); // NLM_F_CAPPED
    bytes.extend_from_slice(&sequence.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&code.to_ne_bytes());
    // The echoed request header.
    bytes.extend_from_slice(&[20, 0, 0, 0, 0x1c, 0, 5, 0]);
    bytes.extend_from_slice(&sequence.to_ne_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes
}

#[test]
fn acks_errors_and_dump_ends_are_read() {
    let mut datagram = error_message(42, -libc::ESRCH);
    datagram.extend(error_message(43, 0));
    // NLMSG_DONE of a dump that failed with EINTR, then a plain one.
    for code in [-libc::EINTR, 0] {
        datagram.extend_from_slice(&20u32.to_ne_bytes());
        datagram.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        datagram.extend_from_slice(&[2, 0, 44, 0, 0, 0, 0, 0, 0, 0]);
        datagram.extend_from_slice(&code.to_ne_bytes());
    }
    let parsed: Vec<_> = replies(&datagram).collect();
    assert_eq!(parsed.len(), 4);
    assert_eq!(parsed[0].header.sequence_number, 42);
    assert_eq!(parsed[0].ack(), Some(Err(libc::ESRCH)));
    assert_eq!(parsed[0].end(), End::Errno(libc::ESRCH));
    assert_eq!(parsed[1].ack(), Some(Ok(())));
    assert_eq!(parsed[1].end(), End::Done);
    assert_eq!(parsed[2].ack(), None);
    assert_eq!(parsed[2].end(), End::Errno(libc::EINTR));
    assert_eq!(parsed[3].end(), End::Done);
}

/// A generic-netlink data message (the controller's type, a 4-byte genl header) for
/// `sequence`.
fn data_message(sequence: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&20u32.to_ne_bytes());
    bytes.extend_from_slice(&GENL_ID_CTRL.to_ne_bytes());
    bytes.extend_from_slice(&0u16.to_ne_bytes());
    bytes.extend_from_slice(&sequence.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&[1, 2, 0, 0]);
    bytes
}

/// Everything a request's channel holds now, and whether its sender is gone.
fn drained(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Part>) -> (Vec<String>, bool) {
    let mut parts = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(part) => parts.push(match part {
                Part::Data(payload) => format!("data {payload:?}"),
                Part::Done => "done".to_owned(),
                Part::Errno(errno) => format!("errno {errno}"),
                Part::Failed(e) => format!("failed {e}"),
            }),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return (parts, false),
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return (parts, true),
        }
    }
}

#[test]
fn needs_barrier_for_acknowledged_requests_that_are_not_dumps() {
    assert!(needs_barrier(NLM_F_REQUEST | NLM_F_ACK));
    assert!(!needs_barrier(NLM_F_REQUEST | NLM_F_DUMP));
    assert!(!needs_barrier(NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP));
    assert!(!needs_barrier(NLM_F_REQUEST));
    // A barrier is a bare header: NLMSG_NOOP, asking for an ack.
    let bytes = encode(Barrier, NLM_F_REQUEST | NLM_F_ACK, 9);
    let expected: [u8; 16] = [16, 0, 0, 0, 1, 0, 5, 0, 9, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(bytes, expected);
}

/// The kernel sends no reply for a request whose handler returned -EINTR (IPVS's
/// DEL_DAEMON of a sync thread that never ran): the acknowledgement of the barrier behind
/// it ends it with EINTR instead of leaving its caller waiting forever.
#[test]
fn a_request_the_kernel_never_answers_is_ended_by_its_barrier() {
    let counts = std::sync::Arc::new(Counts::default());
    let mut in_flight = InFlight::new(counts.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    in_flight.sent(5, Some(6), tx);
    assert!(in_flight.route(&error_message(6, 0)));
    assert_eq!(drained(&mut rx), (vec!["errno 4".to_owned()], true));
    assert!(in_flight.is_empty());
    assert!(counts.to_string().contains("ended 1 "), "{counts}");
    assert!(
        counts.to_string().contains("unanswered requests 1"),
        "{counts}"
    );
}

#[test]
fn barriers_leave_answered_requests_alone() {
    let counts = std::sync::Arc::new(Counts::default());
    let mut in_flight = InFlight::new(counts.clone());
    // Request 7: an answer, its ack and the barrier's ack in one datagram.
    let (tx7, mut rx7) = tokio::sync::mpsc::unbounded_channel();
    in_flight.sent(7, Some(8), tx7);
    // Request 9: refused; the barrier's ack comes in a later datagram.
    let (tx9, mut rx9) = tokio::sync::mpsc::unbounded_channel();
    in_flight.sent(9, Some(10), tx9);
    // Request 11: a dump, no barrier; its data comes after the others' acks.
    let (tx11, mut rx11) = tokio::sync::mpsc::unbounded_channel();
    in_flight.sent(11, None, tx11);
    let mut datagram = data_message(7);
    datagram.extend(error_message(7, 0));
    datagram.extend(error_message(8, 0));
    datagram.extend(error_message(9, -libc::ENOENT));
    assert!(in_flight.route(&datagram));
    assert!(in_flight.route(&error_message(10, 0)));
    assert!(in_flight.route(&data_message(11)));
    assert_eq!(
        drained(&mut rx7),
        (
            vec!["data [1, 2, 0, 0]".to_owned(), "done".to_owned()],
            true
        )
    );
    assert_eq!(drained(&mut rx9), (vec!["errno 2".to_owned()], true));
    assert_eq!(
        drained(&mut rx11),
        (vec!["data [1, 2, 0, 0]".to_owned()], false)
    );
    let text = counts.to_string();
    assert!(text.contains("ended 2 "), "{text}");
    assert!(
        text.contains("unmatched replies 0, unanswered requests 0"),
        "{text}"
    );
    // A reply nobody waits for is counted, not routed.
    assert!(in_flight.route(&error_message(7, 0)));
    assert!(counts.to_string().contains("unmatched replies 1"));
}

#[test]
fn splitting_stops_at_garbage() {
    assert_eq!(replies(&[0xff; 40]).count(), 0);
    assert_eq!(replies(&[0; 8]).count(), 0);
    // A good message, then a header claiming more bytes than there are.
    let mut datagram = error_message(1, 0);
    datagram.extend_from_slice(&[0xff, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(replies(&datagram).count(), 1);
}

#[test]
fn family_request_layout() {
    let bytes = encode(GetFamily("IPVS"), NLM_F_REQUEST | NLM_F_ACK, 3);
    // nlmsghdr, genlmsghdr (GETFAMILY, v1), CTRL_ATTR_FAMILY_NAME "IPVS\0" (len 9, padded).
    let expected: [u8; 32] = [
        32, 0, 0, 0, 0x10, 0, 5, 0, 3, 0, 0, 0, 0, 0, 0, 0, //
        3, 1, 0, 0, //
        9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0,
    ];
    assert_eq!(bytes, expected);
}

/// The generic-netlink controller exists on every Linux kernel (the host's too, which has
/// no IPVS): the socket, family resolution, a dump and a pipeline run against it for real.
mod generic_netlink_controller {
    use netlink_sys::protocols::NETLINK_GENERIC;

    use super::*;

    fn socket() -> NetlinkSocket {
        NetlinkSocket::open(NETLINK_GENERIC).expect("a generic netlink socket")
    }

    /// `CTRL_CMD_GETFAMILY` without a name: as a dump, every family.
    #[derive(Debug)]
    struct AllFamilies;

    impl NetlinkSerializable for AllFamilies {
        fn message_type(&self) -> u16 {
            GENL_ID_CTRL
        }

        fn buffer_len(&self) -> usize {
            4
        }

        fn serialize(&self, buffer: &mut [u8]) {
            buffer.copy_from_slice(&[CTRL_CMD_GETFAMILY, 1, 0, 0]);
        }
    }

    #[test]
    fn families_are_resolved_by_name() {
        let mut socket = socket();
        assert_eq!(
            resolve_family(&mut socket, "nlctrl").expect("answered"),
            Some(GENL_ID_CTRL)
        );
        assert_eq!(
            resolve_family(&mut socket, "no-such-family").expect("answered"),
            None
        );
    }

    #[test]
    fn a_dump_hands_out_every_part_then_ends() {
        let mut socket = socket();
        let mut names = Vec::new();
        let end = socket
            .dump(AllFamilies, |reply| {
                let attrs = reply.payload.get(4..).unwrap_or_default();
                for nla in netlink_packet_core::NlasIterator::new(attrs).flatten() {
                    if nla.kind() == CTRL_ATTR_FAMILY_NAME {
                        names.push(String::from_utf8_lossy(nla.value()).into_owned());
                    }
                }
            })
            .expect("dumped");
        assert_eq!(end, Ok(()));
        assert!(names.iter().any(|n| n.trim_end_matches('\0') == "nlctrl"));
        // The socket is usable again after the dump.
        assert!(
            resolve_family(&mut socket, "nlctrl")
                .expect("answered")
                .is_some()
        );
    }

    #[test]
    fn a_socket_whose_buffers_were_released_answers_as_before() {
        let mut socket = socket();
        assert_eq!(
            socket.buffered_bytes(),
            0,
            "no buffer before the first request"
        );
        let families = |socket: &mut NetlinkSocket| {
            let mut n = 0;
            let end = socket.dump(AllFamilies, |_| n += 1).expect("dumped");
            assert_eq!(end, Ok(()));
            n
        };
        let before = families(&mut socket);
        assert!(before > 0);
        assert!(
            socket.buffered_bytes() >= 32 * 32 * 1024,
            "32 buffers of 32 KiB"
        );
        socket.release_buffers();
        assert_eq!(socket.buffered_bytes(), 0);
        assert_eq!(families(&mut socket), before);
    }

    /// All parts of one request on the async connection, up to its end.
    async fn parts(mut rx: tokio::sync::mpsc::UnboundedReceiver<Part>) -> Vec<Part> {
        let mut parts = Vec::new();
        while let Some(part) = rx.recv().await {
            let end = !matches!(part, Part::Data(_));
            parts.push(part);
            if end {
                break;
            }
        }
        parts
    }

    #[test]
    fn the_connection_answers_requests_and_dumps_with_barriers_in_between() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (connection, handle) = Connection::open(NETLINK_GENERIC).expect("connection");
            let task = tokio::spawn(connection.run());
            let acked = NLM_F_REQUEST | NLM_F_ACK;
            // Queued together: each non-dump request has a barrier behind it, the dump none.
            let found = handle.request(GetFamily("nlctrl"), acked).expect("queued");
            let missing = handle
                .request(GetFamily("no-such-family"), acked)
                .expect("queued");
            let dump = handle
                .request(AllFamilies, NLM_F_REQUEST | NLM_F_DUMP)
                .expect("queued");
            let again = handle.request(GetFamily("nlctrl"), acked).expect("queued");
            let found = parts(found).await;
            assert!(
                matches!(found.as_slice(), [Part::Data(_), Part::Done]),
                "{found:?}"
            );
            let missing = parts(missing).await;
            assert!(
                matches!(missing.as_slice(), [Part::Errno(libc::ENOENT)]),
                "{missing:?}"
            );
            let dump = parts(dump).await;
            assert!(dump.len() > 1, "{dump:?}");
            assert!(matches!(dump.last(), Some(Part::Done)), "{dump:?}");
            let again = parts(again).await;
            assert!(
                matches!(again.as_slice(), [Part::Data(_), Part::Done]),
                "{again:?}"
            );
            let counts = handle.counts().to_string();
            assert!(counts.contains("queued 4,"), "{counts}");
            assert!(counts.contains("ended 4 "), "{counts}");
            assert!(
                counts.contains("unmatched replies 0, unanswered requests 0"),
                "{counts}"
            );
            drop(handle);
            task.await
                .expect("the connection ends once its handles are gone");
        });
    }

    #[test]
    fn a_pipeline_answers_every_request_once_across_datagrams() {
        let mut socket = socket();
        // More requests than fit one datagram (2,048 per chunk), every other one refused.
        let names = ["nlctrl", "no-such-family"];
        let n = 5000;
        let mut answers = vec![None; n];
        socket.pipeline((0..n).map(|i| (i, GetFamily(names[i % 2]))), |i, answer| {
            assert!(answers[i].is_none(), "request {i} answered twice");
            answers[i] = Some(match answer {
                Answer::Ack => Ok(()),
                Answer::Errno(errno) => Err(errno),
                other => panic!("request {i}: {other:?}"),
            });
        });
        for (i, answer) in answers.iter().enumerate() {
            let expected = if i % 2 == 0 {
                Ok(())
            } else {
                Err(libc::ENOENT)
            };
            assert_eq!(*answer, Some(expected), "request {i}");
        }
    }
}

/// A page-sized socket reads with `NLMSG_GOODSIZE` as a 64-bit kernel with the fewest
/// fragments computes it (`SKB_WITH_OVERHEAD(min(PAGE_SIZE, 8192))`, 320 bytes of shared
/// info): the kernel then makes each dump part of data and overhead in one page, and never
/// a part larger than the buffer.
#[test]
#[cfg(target_pointer_width = "64")]
fn a_page_sized_socket_reads_with_a_page_less_the_buffer_overhead() {
    use super::socket::page_slot;
    assert_eq!(page_slot(4096), 4096 - 320);
    // Pages above 8 KiB: the kernel's NLMSG_GOODSIZE stops at 8 KiB.
    assert_eq!(page_slot(16 * 1024), 8192 - 320);
    assert_eq!(page_slot(64 * 1024), 8192 - 320);
}
