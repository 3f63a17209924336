//! Which client a request comes from, behind reverse proxies (CHIME_TRUSTED_PROXIES).
//!
//! A proxy appends the address it got the request from to `X-Forwarded-For`, so the header
//! reads left to right from the client to the last proxy, and only the entries written by
//! proxies we trust are true: whatever is to their left, a client could have written. So
//! the header is believed only when the connection comes from a trusted proxy, and read
//! right to left past the trusted proxies; the first address that is not one is the
//! client. (actix-web's `realip_remote_addr` takes the leftmost entry from anyone, which
//! lets a client choose its address.) Without trusted proxies the header is ignored.

use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use actix_web::HttpRequest;
use ipnet::IpNet;

/// A CHIME_TRUSTED_PROXIES entry: an address (`192.0.2.7`, `::1`) or a range (`10.0.0.0/8`).
fn parse_proxy(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    match IpAddr::from_str(text) {
        Ok(address) => Ok(IpNet::from(address.to_canonical())),
        Err(_) => IpNet::from_str(text)
            .map_err(|_| format!("`{text}` is not an IP address or a CIDR range (like 10.0.0.0/8 or 192.0.2.7, comma-separated)")),
    }
}

/// The proxies whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// CHIME_TRUSTED_PROXIES: entries separated by commas; empty means none.
    pub fn parse(text: &str) -> Result<TrustedProxies, String> {
        text.split(',').filter(|p| !p.trim().is_empty()).map(parse_proxy).collect::<Result<_, _>>().map(TrustedProxies)
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&address))
    }

    /// The client's address: the peer's, or behind trusted proxies the one they forwarded.
    pub fn client(&self, req: &HttpRequest) -> IpAddr {
        let peer = req.peer_addr().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip().to_canonical());
        let forwarded = req.headers().get_all("x-forwarded-for").filter_map(|v| v.to_str().ok());
        self.client_of(peer, forwarded)
    }

    /// `forwarded`: the X-Forwarded-For header lines in the order received.
    fn client_of<'a>(&self, peer: IpAddr, forwarded: impl Iterator<Item = &'a str>) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let entries: Vec<&str> = forwarded.flat_map(|line| line.split(',')).collect();
        let mut client = peer;
        for entry in entries.into_iter().rev() {
            // An entry that is no address was written by whoever is beyond the last
            // trusted hop, which is then the nearest address known.
            let Some(address) = parse_entry(entry) else { break };
            client = address;
            if !self.trusts(address) {
                break;
            }
        }
        client
    }
}

/// An entry as proxies write it: an address, some with a port (`192.0.2.7:4711`, `[2001:db8::1]:4711`).
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Some(address.to_canonical());
    }
    entry.parse::<std::net::SocketAddr>().ok().map(|s| s.ip().to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&list.join(",")).unwrap()
    }

    #[test]
    fn the_header_is_read_right_to_left_past_trusted_proxies() {
        let trusted = proxies(&["10.0.0.0/8", "192.0.2.7"]);
        let client = |peer: &str, lines: &[&str]| trusted.client_of(ip(peer), lines.iter().copied());
        // A client that forges the header gets its own address appended by the proxy.
        assert_eq!(client("10.0.0.1", &["6.6.6.6, 203.0.113.5"]), ip("203.0.113.5"));
        // Two proxies, the header split over two lines.
        assert_eq!(client("192.0.2.7", &["6.6.6.6, 203.0.113.5", "10.1.2.3"]), ip("203.0.113.5"));
        assert_eq!(client("10.0.0.1", &["[2001:db8::1]:4711"]), ip("2001:db8::1"));
        assert_eq!(client("10.0.0.1", &["198.51.100.1:4711"]), ip("198.51.100.1"));
        // Everything trusted: the farthest address known.
        assert_eq!(client("10.0.0.1", &["10.9.9.9"]), ip("10.9.9.9"));
        // Garbage beyond a trusted hop: that hop.
        assert_eq!(client("10.0.0.1", &["evil, 10.9.9.9"]), ip("10.9.9.9"));
        // No header: the proxy itself.
        assert_eq!(client("10.0.0.1", &[]), ip("10.0.0.1"));
        // From an untrusted peer the header is not read at all.
        assert_eq!(client("203.0.113.5", &["10.0.0.1"]), ip("203.0.113.5"));
        assert_eq!(TrustedProxies::default().client_of(ip("127.0.0.1"), ["198.51.100.1"].into_iter()), ip("127.0.0.1"));
    }

    #[test]
    fn entries_are_addresses_or_ranges() {
        assert_eq!(parse_proxy(" 127.0.0.1 ").unwrap(), "127.0.0.1/32".parse::<IpNet>().unwrap());
        assert!(parse_proxy("fd00::/8").is_ok());
        for bad in ["10.0.0.0/33", "proxy.example", "10.0.0.1:80"] {
            let e = TrustedProxies::parse(&format!("10.0.0.1, {bad}")).unwrap_err();
            assert!(e.contains(&format!("`{bad}` is not an IP address or a CIDR range")), "{e}");
        }
        assert_eq!(TrustedProxies::parse(" ").unwrap().0, [], "empty is none");
        assert_eq!(TrustedProxies::parse("10.0.0.1,,::1").unwrap().0.len(), 2);
    }
}
