//! Which addresses callbacks may go to (`CHIME_DENY_PRIVATE_CALLBACKS`).
//!
//! By default any http(s) URL is accepted: most receivers live on private networks. An
//! install whose biz type admins are not trusted with its internal network turns on the
//! deny list, and chime then refuses callbacks to loopback, private, link-local, CGNAT and
//! unspecified addresses, so that a callback URL cannot be used to reach internal services
//! or the cloud metadata endpoint (169.254.169.254).
//!
//! The check is made twice. When a biz type is saved, an IP-literal host (or `localhost`)
//! in a denied range is refused with a validation error. At delivery, because a name can
//! resolve to something else later, the engine's HTTP client resolves names itself and drops
//! denied addresses (`PublicOnlyResolver`), checks IP-literal hosts before sending (reqwest
//! connects to those without asking a resolver), and checks redirect targets likewise.

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
    format!("callback address {ip} is in a denied range ({range}); see CHIME_DENY_PRIVATE_CALLBACKS")
}

/// The denied range an address is in, by name, or `None` for an address callbacks may reach.
pub fn denied_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => denied_v4(ip),
        IpAddr::V6(ip) => denied_v6(ip),
    }
}

fn denied_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    match (a, b) {
        // 0.0.0.0/8: Linux connects 0.0.0.0 to this machine.
        (0, _) => Some("unspecified"),
        (127, _) => Some("loopback"),
        (10, _) | (192, 168) => Some("private"),
        (172, 16..=31) => Some("private"),
        (169, 254) => Some("link-local"),
        (100, 64..=127) => Some("shared address space (CGNAT)"),
        _ => None,
    }
}

fn denied_v6(ip: Ipv6Addr) -> Option<&'static str> {
    // ::ffff:10.0.0.5 reaches 10.0.0.5.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return denied_v4(v4);
    }
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if first & 0xfe00 == 0xfc00 {
        Some("private")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else {
        None
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
    /// `PublicOnlyResolver` and redirects checked by `redirect_policy`. IP-literal callback
    /// URLs are still for the caller to check (`address_refusal`).
    pub fn http_client(self) -> reqwest::ClientBuilder {
        let client = reqwest::Client::builder().redirect(redirect_policy(self));
        match self {
            CallbackHosts::Any => client,
            CallbackHosts::PublicOnly => client.dns_resolver(PublicOnlyResolver),
        }
    }
}

/// Redirects followed as by default (at most 10), but never to a denied IP literal: the
/// resolver is not asked about those.
fn redirect_policy(hosts: CallbackHosts) -> reqwest::redirect::Policy {
    if hosts == CallbackHosts::Any {
        return reqwest::redirect::Policy::default();
    }
    reqwest::redirect::Policy::custom(move |attempt| {
        if let Some(reason) = hosts.address_refusal(attempt.url()) {
            attempt.error(reason)
        } else if attempt.previous().len() > 10 {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
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
