//! Reading netlink datagrams: the messages one `recv` returned, shared by the blocking
//! rtnetlink socket (`addr_socket`), the route deletion watch (`lo_routes`) and the
//! nftables batches' answers (`nft::nl`).

/// The netlink messages of one datagram (`data`, as `recv` returned it), in order, each at
/// its 4-byte aligned offset (`NLMSG_ALIGN`), decoded as `NetlinkMessage<I>` (rtnetlink's
/// or nftables' payloads). A message that does not decode is yielded as its error and ends
/// the iteration, as does a header of length 0 (it would never advance).
pub(crate) fn messages<I: netlink_packet_core::NetlinkDeserializable>(
    data: &[u8],
) -> impl Iterator<
    Item = Result<netlink_packet_core::NetlinkMessage<I>, netlink_packet_core::DecodeError>,
> + '_ {
    let mut off = 0;
    std::iter::from_fn(move || {
        let rest = data.get(off..).filter(|r| !r.is_empty())?;
        match netlink_packet_core::NetlinkMessage::<I>::deserialize(rest) {
            Ok(m) => {
                let len = usize::try_from(m.header.length).unwrap_or(0);
                off = match len {
                    0 => data.len(),
                    len => off + ((len + 3) & !3),
                };
                (len > 0).then_some(Ok(m))
            }
            Err(e) => {
                off = data.len();
                Some(Err(e))
            }
        }
    })
}
