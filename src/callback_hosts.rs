//! Which addresses callbacks may go to (`CHIME_DENY_PRIVATE_CALLBACKS`).
//!
//! By default any http(s) URL is accepted: most receivers live on private networks. An
//! install whose biz type admins are not trusted with its internal network turns on the
//! deny list, and chime then refuses callbacks to loopback, private, link-local, CGNAT,
//! unspecified and the other special-purpose addresses (documentation, benchmarking,
//! multicast, reserved, site-local…), so that a callback URL cannot be used to reach
//! internal services or the cloud metadata endpoint (169.254.169.254). An IPv6 address that
//! carries an IPv4 one (IPv4-mapped or -compatible, SIIT, NAT64, 6to4, Teredo) reaches that
//! IPv4 host through a translator or tunnel, so it is judged by the IPv4 address.
//!
//! The check is made twice. When a biz type is saved, an IP-literal host (or `localhost`)
//! in a denied range is refused with a validation error. At delivery, because a name can
//! resolve to something else later, the engine's HTTP client resolves names itself and drops
//! denied addresses (`PublicOnlyResolver`), checks IP-literal hosts before sending (reqwest
//! connects to those without asking a resolver), and checks the targets of the redirects it
//! follows likewise.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The install's rule for callback hosts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CallbackHosts {
    /// Any host (the default).
    #[default]
    Any,
    /// Only hosts outside the denied ranges (`CHIME_DENY_PRIVATE_CALLBACKS=true`).
    PublicOnly,
}

impl CallbackHosts {
    pub fn from_deny_private(deny: bool) -> Self {
        if deny { CallbackHosts::PublicOnly } else { CallbackHosts::Any }
    }

    /// Why a biz type may not be saved with this callback URL: its host is an address in a
    /// denied range, or `localhost`. `None` when allowed (other names are checked when
    /// resolved, at delivery).
    pub fn refusal(self, url: &url::Url) -> Option<String> {
        match url.host() {
            // `localhost` never needs DNS to mean this machine (RFC 6761).
            Some(url::Host::Domain(name)) if self == CallbackHosts::PublicOnly && is_localhost(name) => {
                Some(format!("callback host {name} is in a denied range (loopback); see CHIME_DENY_PRIVATE_CALLBACKS"))
            }
            _ => self.address_refusal(url),
        }
    }

    /// Why a callback to this URL is refused by its IP-literal host: reqwest connects to an
    /// address without asking the resolver, so delivery and redirects check it here.
    pub fn address_refusal(self, url: &url::Url) -> Option<String> {
        if self == CallbackHosts::Any {
            return None;
        }
        let ip = match url.host()? {
            url::Host::Ipv4(ip) => IpAddr::V4(ip),
            url::Host::Ipv6(ip) => IpAddr::V6(ip),
            url::Host::Domain(_) => return None,
        };
        denied_range(ip).map(|range| refusal_message(ip, range))
    }
}

fn is_localhost(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

pub fn refusal_message(ip: IpAddr, range: &str) -> String {
    let embedded = match ip {
        IpAddr::V6(v6) => embedded_ipv4(v6).map(|(form, v4)| format!(" ({form} of {v4})")),
        IpAddr::V4(_) => None,
    };
    let embedded = embedded.unwrap_or_default();
    format!("callback address {ip}{embedded} is in a denied range ({range}); see CHIME_DENY_PRIVATE_CALLBACKS")
}

/// The denied range an address is in, by name, or `None` for an address callbacks may reach.
/// An IPv6 address that carries an IPv4 address, which a translator or tunnel would
/// deliver to, is judged by that IPv4 address.
pub fn denied_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => denied_v4(ip),
        IpAddr::V6(ip) => match embedded_ipv4(ip) {
            Some((_, v4)) => denied_v4(v4),
            None => denied_v6(ip),
        },
    }
}

/// The IPv4 ranges of IANA's special-purpose registry that are not globally reachable, with
/// multicast and broadcast; the first that contains an address names it.
const DENIED_V4: &[(Ipv4Addr, u8, &str)] = &[
    // Linux connects 0.0.0.0 to this machine.
    (Ipv4Addr::new(0, 0, 0, 0), 8, "unspecified"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "shared address space (CGNAT)"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "IETF protocol assignments"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "documentation"),
    (Ipv4Addr::new(192, 88, 99, 0), 24, "6to4 relay anycast"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "documentation"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "documentation"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::BROADCAST, 32, "broadcast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved"),
];

/// The IPv6 ranges of IANA's special-purpose registry that are not globally reachable, with
/// site-local and multicast, besides those carrying an IPv4 address (`embedded_ipv4`).
const DENIED_V6: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified"),
    (Ipv6Addr::LOCALHOST, 128, "loopback"),
    // Its IPv4 address may sit at any of RFC 6052's offsets, which only the network that
    // runs the translator knows; and it is local by definition (RFC 8215).
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48, "local-use NAT64"),
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64, "discard-only"),
    (Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0), 48, "benchmarking"),
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32, "documentation"),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, "documentation"),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, "private"),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, "link-local"),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, "site-local"),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "multicast"),
];

fn denied_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let ip = u32::from(ip);
    DENIED_V4.iter().find(|(net, len, _)| ip >> (32 - len) == u32::from(*net) >> (32 - len)).map(|(_, _, name)| *name)
}

fn denied_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let ip = u128::from(ip);
    DENIED_V6.iter().find(|(net, len, _)| ip >> (128 - len) == u128::from(*net) >> (128 - len)).map(|(_, _, name)| *name)
}

/// The IPv4 address an IPv6 address stands for, with the form's name, for the forms that
/// reach an IPv4 host: IPv4-mapped, IPv4-compatible, SIIT, NAT64 (well-known prefix), 6to4
/// and Teredo (the client's address).
fn embedded_ipv4(ip: Ipv6Addr) -> Option<(&'static str, Ipv4Addr)> {
    let bits = u128::from(ip);
    let last32 = Ipv4Addr::from(bits as u32);
    match ip.segments() {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(("IPv4-mapped", last32)),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(("SIIT", last32)),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(("NAT64", last32)),
        // :: and ::1 are IPv6's own (RFC 4291 §2.5.5.1).
        [0, 0, 0, 0, 0, 0, _, _] if bits > 1 => Some(("IPv4-compatible", last32)),
        [0x2002, _, _, _, _, _, _, _] => Some(("6to4", Ipv4Addr::from((bits >> 80) as u32))),
        [0x2001, 0, _, _, _, _, _, _] => Some(("Teredo", Ipv4Addr::from(!(bits as u32)))),
        _ => None,
    }
}

/// Resolves callback host names and keeps only addresses outside the denied ranges; when
/// none is left, fails with the reason, which becomes the attempt's error.
pub struct PublicOnlyResolver;

impl reqwest::dns::Resolve for PublicOnlyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest puts in the URL's port.
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refused = None;
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| match denied_range(addr.ip()) {
                    Some(range) => {
                        first_refused.get_or_insert((addr.ip(), range));
                        false
                    }
                    None => true,
                })
                .collect();
            if let (true, Some((ip, range))) = (allowed.is_empty(), first_refused) {
                return Err(refusal_message(ip, range).into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl CallbackHosts {
    /// An HTTP client that keeps to this rule: under `PublicOnly`, names are resolved by
    /// `PublicOnlyResolver`. It follows no redirect. IP-literal URLs, the callback's and
    /// those it is redirected to, are for the caller to check (`address_refusal`).
    pub fn http_client(self) -> reqwest::ClientBuilder {
        // The engine follows only the redirects that keep the method and body
        // (`engine::deliver`): reqwest's own rules turn a POST into a bodiless GET on a 301,
        // 302 or 303.
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
        match self {
            CallbackHosts::Any => client,
            CallbackHosts::PublicOnly => client.dns_resolver(PublicOnlyResolver),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(ip: &str) -> Option<&'static str> {
        denied_range(ip.parse().unwrap())
    }

    #[test]
    fn private_loopback_link_local_cgnat_and_unspecified_are_denied() {
        for (ip, expected) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.0.0.5", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "shared address space (CGNAT)"),
            ("100.127.255.255", "shared address space (CGNAT)"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fc00::1", "private"),
            ("fd12:3456::1", "private"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
        ] {
            assert_eq!(range(ip), Some(expected), "{ip}");
        }
    }

    #[test]
    fn ipv4_mapped_ipv6_is_judged_by_its_ipv4_address() {
        assert_eq!(range("::ffff:127.0.0.1"), Some("loopback"));
        assert_eq!(range("::ffff:10.1.2.3"), Some("private"));
        assert_eq!(range("::ffff:169.254.169.254"), Some("link-local"));
        assert_eq!(range("::ffff:100.100.0.1"), Some("shared address space (CGNAT)"));
        assert_eq!(range("::ffff:0.0.0.0"), Some("unspecified"));
        assert_eq!(range("::ffff:8.8.8.8"), None);
    }

    #[test]
    fn public_addresses_and_range_neighbours_are_allowed() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "169.253.255.255",
            "100.63.255.255",
            "100.128.0.0",
            "11.0.0.1",
            "2001:4860:4860::8888",
            "fe7f::1",
            "fbff::1",
        ] {
            assert_eq!(range(ip), None, "{ip}");
        }
    }

    /// IPv6 forms that carry an IPv4 address are judged by that address, so that a private
    /// IPv4 cannot be reached through a translator or tunnel; the same forms of a public
    /// address stay allowed.
    #[test]
    fn ipv4_embedded_in_ipv6_transition_forms_is_judged_as_ipv4() {
        for (ip, expected) in [
            // NAT64, well-known prefix (RFC 6052)
            ("64:ff9b::a9fe:a9fe", Some("link-local")),
            ("64:ff9b::7f00:1", Some("loopback")),
            ("64:ff9b::10.0.0.5", Some("private")),
            ("64:ff9b::8.8.8.8", None),
            // IPv4-compatible (deprecated, RFC 4291)
            ("::10.0.0.5", Some("private")),
            ("::127.0.0.1", Some("loopback")),
            ("::8.8.8.8", None),
            // IPv4-translated, SIIT (RFC 2765)
            ("::ffff:0:10.0.0.5", Some("private")),
            ("::ffff:0:169.254.169.254", Some("link-local")),
            ("::ffff:0:8.8.8.8", None),
            // 6to4 (RFC 3056): the IPv4 address is the second and third groups
            ("2002:a00:5::1", Some("private")),
            ("2002:7f00:1::", Some("loopback")),
            ("2002:a9fe:a9fe:1::1", Some("link-local")),
            ("2002:c633:6401::1", Some("documentation")),
            ("2002:808:808::1", None),
            // Teredo (RFC 4380): the client's IPv4 address, bit-inverted, is the last 32 bits
            ("2001:0:4136:e378:8000:63bf:f5ff:fffa", Some("private")),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", Some("loopback")),
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", None),
        ] {
            assert_eq!(range(ip), expected, "{ip}");
        }
    }

    #[test]
    fn special_purpose_ranges_are_denied_by_name() {
        for (ip, expected) in [
            ("192.0.0.8", "IETF protocol assignments"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.255", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("192.88.99.1", "6to4 relay anycast"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("fec0::1", "site-local"),
            ("feff::1", "site-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("100::1", "discard-only"),
            ("2001:2::1", "benchmarking"),
            ("64:ff9b:1::a00:5", "local-use NAT64"),
            ("64:ff9b:1::808:808", "local-use NAT64"),
        ] {
            assert_eq!(range(ip), Some(expected), "{ip}");
        }
        for ip in [
            "192.0.1.255",
            "192.0.3.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.101.0",
            "203.0.114.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2001:db9::1",
            "2001:3::1",
            "2003::1",
            "3ffe::1",
            "100:0:0:1::1",
        ] {
            assert_eq!(range(ip), None, "{ip}");
        }
    }

    #[test]
    fn a_refusal_names_the_embedded_ipv4_address() {
        let refusal = |url: &str| CallbackHosts::PublicOnly.refusal(&url::Url::parse(url).unwrap()).unwrap_or_default();
        assert_eq!(
            refusal("http://[2002:a9fe:a9fe::]/"),
            "callback address 2002:a9fe:a9fe:: (6to4 of 169.254.169.254) is in a denied range (link-local); see CHIME_DENY_PRIVATE_CALLBACKS"
        );
        assert_eq!(
            refusal("http://[64:ff9b::a00:5]/"),
            "callback address 64:ff9b::a00:5 (NAT64 of 10.0.0.5) is in a denied range (private); see CHIME_DENY_PRIVATE_CALLBACKS"
        );
        assert_eq!(
            refusal("http://198.18.0.1/"),
            "callback address 198.18.0.1 is in a denied range (benchmarking); see CHIME_DENY_PRIVATE_CALLBACKS"
        );
    }

    #[test]
    fn urls_are_refused_by_literal_host_or_localhost_only_when_denying() {
        let refusal = |url: &str| CallbackHosts::PublicOnly.refusal(&url::Url::parse(url).unwrap());
        assert_eq!(
            refusal("http://10.0.0.5:8080/hook").as_deref(),
            Some("callback address 10.0.0.5 is in a denied range (private); see CHIME_DENY_PRIVATE_CALLBACKS")
        );
        assert!(refusal("http://[::ffff:127.0.0.1]/").is_some());
        assert!(refusal("http://[fe80::1]/").is_some());
        // The URL parser normalises other spellings of an address: 2130706433 is 127.0.0.1.
        assert!(refusal("http://2130706433/").is_some());
        assert!(refusal("http://0x7f.1/").is_some());
        for name in ["localhost", "LOCALHOST.", "api.localhost"] {
            assert!(refusal(&format!("https://{name}/hook")).unwrap().contains("loopback"), "{name}");
        }
        assert_eq!(refusal("https://hooks.example.com/x"), None, "names are checked when resolved");
        assert_eq!(refusal("https://93.184.216.34/"), None);
        assert_eq!(CallbackHosts::Any.refusal(&url::Url::parse("http://localhost/").unwrap()), None);
        assert_eq!(CallbackHosts::Any.refusal(&url::Url::parse("http://127.0.0.1/").unwrap()), None);
        // At delivery a name, `localhost` included, is left to the resolver.
        let at_delivery = |url: &str| CallbackHosts::PublicOnly.address_refusal(&url::Url::parse(url).unwrap());
        assert_eq!(at_delivery("http://localhost/"), None);
        assert!(at_delivery("http://127.0.0.1/").is_some());
    }
}
