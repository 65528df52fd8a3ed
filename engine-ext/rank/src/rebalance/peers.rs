//! `--peers`: the fleet's endpoints as the gateway's `endpoints` list them
//! (`docs/gateway.md` "Plugin configuration"), in the same order, so this rank
//! computes the same rendezvous candidates as the filter
//! ([`tether_placement::Placement`] hashes each endpoint's name, else its
//! address, with its weight).

use std::collections::HashSet;
use std::net::SocketAddr;
use tether_placement::{Endpoint, Placement};

/// Reads `address[,weight[,name]]` values; `Err` says which value is wrong
/// and why (the caller names the flag).
pub fn parse(values: &[String]) -> Result<Vec<Endpoint>, String> {
    let values: Vec<&str> = values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .collect();
    if values.len() < 2 {
        return Err("at least two endpoints (this rank and another), as the gateway's `endpoints` list them".into());
    }
    let (mut addrs, mut names) = (HashSet::new(), HashSet::new());
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        let bad = |why: &str| format!("{v:?}: {why}");
        let mut parts = v.split(',');
        // The address as written: rendezvous hashes its text (as the gateway does).
        let text = parts.next().unwrap_or_default().trim();
        let addr: SocketAddr = tether_wire::params::parse_pull_from(text)
            .ok_or_else(|| bad("must start with one ip:port (a literal IP, port not 0)"))?;
        let weight = match parts.next() {
            None => 1.0,
            Some(w) => w
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|w| w.is_finite() && *w > 0.0)
                .ok_or_else(|| bad("the weight must be a positive number"))?,
        };
        let name = match parts.next().map(str::trim) {
            None => None,
            Some(n) if n.is_empty() || n.contains(char::is_whitespace) => {
                return Err(bad("a name must be non-empty, without spaces"));
            }
            Some(n) => Some(n.to_owned()),
        };
        if parts.next().is_some() {
            return Err(bad("address[,weight[,name]]: too many commas"));
        }
        if !addrs.insert(addr) {
            return Err(bad("the address is listed twice"));
        }
        if let Some(n) = &name
            && !names.insert(n.clone())
        {
            return Err(bad("the name is listed twice"));
        }
        out.push(Endpoint {
            address: text.to_owned(),
            weight,
            dp_size: 1,
            name,
        });
    }
    Ok(out)
}

/// The endpoints prepared for placement, with which one is this rank.
#[derive(Debug, Clone)]
pub struct Peers {
    pub placement: Placement,
    /// Each endpoint's address, by index.
    pub addrs: Vec<SocketAddr>,
    /// This rank's index.
    pub me: usize,
}

impl Peers {
    /// Finds this rank among `eps`: the endpoint named `rank_id`, else the
    /// one whose address is `rank_id` or `listen`. `Err` says why none is.
    pub fn resolve(
        eps: &[Endpoint],
        rank_id: Option<&str>,
        listen: SocketAddr,
    ) -> Result<Peers, String> {
        let addrs: Vec<SocketAddr> = eps
            .iter()
            .map(|e| e.address.parse())
            .collect::<Result<_, _>>()
            .map_err(|_| "an address is not ip:port".to_owned())?;
        let by_name = rank_id.and_then(|id| eps.iter().position(|e| e.name.as_deref() == Some(id)));
        let by_addr = || {
            let id: Option<SocketAddr> = rank_id.and_then(|i| i.parse().ok());
            addrs.iter().position(|a| Some(*a) == id || *a == listen)
        };
        let me = by_name.or_else(by_addr).ok_or_else(|| {
            format!(
                "no endpoint is this rank (--rank-id {}, --listen {listen}): list it by its address or name it --rank-id",
                rank_id.unwrap_or("-")
            )
        })?;
        Ok(Peers {
            placement: Placement::new(eps),
            addrs,
            me,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn values_read_as_the_gateways_endpoints() {
        let eps = parse(&s(&["127.0.0.1:1", "127.0.0.1:2,2", "[::1]:3,1,r-c"])).unwrap();
        assert_eq!(eps[0].weight, 1.0);
        assert_eq!((eps[1].weight, eps[1].name.as_deref()), (2.0, None));
        assert_eq!(
            (eps[2].address.as_str(), eps[2].name.as_deref()),
            ("[::1]:3", Some("r-c"))
        );
        // One value holding them all, separated by spaces, reads the same
        // (clap splits on spaces; empty pieces are ignored).
        assert_eq!(
            parse(&s(&["127.0.0.1:1", "", "127.0.0.1:2"]))
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn bad_values_say_why() {
        for (v, why) in [
            (vec!["127.0.0.1:1"], "at least two"),
            (vec!["127.0.0.1:1", "host:2"], "ip:port"),
            (vec!["127.0.0.1:1", "127.0.0.1:0"], "ip:port"),
            (vec!["127.0.0.1:1", "127.0.0.1:2,0"], "weight"),
            (vec!["127.0.0.1:1", "127.0.0.1:2,x"], "weight"),
            (vec!["127.0.0.1:1", "127.0.0.1:2,1,"], "name"),
            (vec!["127.0.0.1:1", "127.0.0.1:2,1,a,b"], "too many"),
            (vec!["127.0.0.1:1", "127.0.0.1:1"], "twice"),
            (vec!["127.0.0.1:1,1,a", "127.0.0.1:2,1,a"], "twice"),
        ] {
            let e = parse(&s(&v)).unwrap_err();
            assert!(e.contains(why), "{v:?}: {e}");
        }
    }

    #[test]
    fn this_rank_is_found_by_name_then_address() {
        let eps = parse(&s(&["127.0.0.1:1,1,a", "127.0.0.1:2", "127.0.0.1:3,1,c"])).unwrap();
        let other: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(Peers::resolve(&eps, Some("c"), other).unwrap().me, 2);
        assert_eq!(
            Peers::resolve(&eps, Some("127.0.0.1:2"), other).unwrap().me,
            1
        );
        let l: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(Peers::resolve(&eps, None, l).unwrap().me, 0);
        let e = Peers::resolve(&eps, Some("zz"), other).unwrap_err();
        assert!(e.contains("--rank-id zz"), "{e}");
    }
}
