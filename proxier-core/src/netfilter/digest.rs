//! A digest of what the proxier's tables hold, kept in the tables themselves (set
//! `plan-digest`), so that a restart finding the tables already holding its plan adopts
//! them instead of rewriting them (a rewrite of tens of thousands of set elements takes
//! seconds and changes nothing).
//!
//! The digest is a sum: a hash of the rules (the tables as [`render_replace`] renders them
//! with no set element, so the options and the rules are in it) plus one hash per set
//! element. A sum is what makes it cheap to keep: an incremental update adds the hashes of
//! the elements it adds and subtracts those it deletes ([`changed_digest`]), in the cost of
//! the change, and writes the new digest in the same transaction. It detects accidental
//! differences (a restart with other Services, options or binary), not tampering: edits
//! to the tables behind the proxier's back are repaired by the hourly rewrite, as on every
//! resync ([`super::Netfilter::check_tables`]).

use std::fmt::Write as _;

use super::plan::{FamilyPlan, NetfilterPlan};
use super::render::{
    DIGEST_SET, RenderError, RenderOptions, SetVisitor, nft_family, render_replace, visit_sets,
};
use super::tracker::PlanChanges;
use crate::model::AddressFamily;

/// The digest of the tables that `plan` renders to with `options`.
pub fn plan_digest(plan: &NetfilterPlan, options: &RenderOptions) -> Result<u64, RenderError> {
    let mut rules = NetfilterPlan::default();
    for family in AddressFamily::ALL {
        if let Some(family_plan) = plan.family(family) {
            let mut empty = FamilyPlan::new(family, family_plan.cluster_ip_masquerade.clone());
            empty.routed_service_cidrs = family_plan.routed_service_cidrs.clone();
            match family {
                AddressFamily::V4 => rules.v4 = Some(empty),
                AddressFamily::V6 => rules.v6 = Some(empty),
            }
        }
    }
    let rules = mix(fnv1a(render_replace(&rules, options)?.as_bytes()));
    Ok(rules.wrapping_add(elements_sum(plan)))
}

/// `digest` after the update `changes` (elements added and deleted).
pub fn changed_digest(digest: u64, changes: &PlanChanges) -> u64 {
    digest
        .wrapping_add(elements_sum(&changes.added))
        .wrapping_sub(elements_sum(&changes.removed))
}

/// The script lines that make every table of `plan`'s families hold `digest` (after the
/// tables were created by the same script, or within an update).
pub fn render_digest(plan: &NetfilterPlan, options: &RenderOptions, digest: u64) -> String {
    let mut out = String::new();
    for family in AddressFamily::ALL {
        if plan.family(family).is_none() {
            continue;
        }
        let (fam, table) = (nft_family(family), &options.table_name);
        let _ = writeln!(out, "flush set {fam} {table} {DIGEST_SET}");
        let _ = writeln!(
            out,
            "add element {fam} {table} {DIGEST_SET} {{ {:#010x} . {:#010x} }}",
            digest >> 32,
            digest & 0xffff_ffff
        );
    }
    out
}

/// The digest an `nft list set` of [`DIGEST_SET`] shows, when it holds exactly one.
pub fn parse_digest(listing: &str) -> Option<u64> {
    let (_, rest) = listing.split_once("elements = {")?;
    let (elements, _) = rest.split_once('}')?;
    let parts: Vec<&str> = elements.split('.').map(str::trim).collect();
    let [high, low] = parts.as_slice() else {
        return None;
    };
    let parse = |part: &str| {
        let hex = part.strip_prefix("0x")?;
        u32::from_str_radix(hex, 16).ok()
    };
    Some((u64::from(parse(high)?) << 32) | u64::from(parse(low)?))
}

/// The sum of the hashes of every set element of `plan`, each hashed with its family and
/// set: the elements rendered one at a time ([`visit_sets`]), none kept.
fn elements_sum(plan: &NetfilterPlan) -> u64 {
    let mut sum = ElementsSum::default();
    for family in AddressFamily::ALL {
        if let Some(family_plan) = plan.family(family) {
            sum.family = nft_family(family);
            visit_sets(family_plan, &mut sum);
        }
    }
    sum.sum
}

/// [`elements_sum`]'s visitor: the family and set being walked, and the sum so far.
#[derive(Default)]
struct ElementsSum {
    family: &'static str,
    /// The hash of the family and the set's name, which each element's hash continues.
    set: u64,
    sum: u64,
}

impl SetVisitor for ElementsSum {
    fn set(&mut self, name: &'static str, _key_type: &str, _interval: bool) {
        let mut hash = fnv1a(self.family.as_bytes());
        hash = fnv1a_continue(hash, &[0]);
        hash = fnv1a_continue(hash, name.as_bytes());
        self.set = fnv1a_continue(hash, &[0]);
    }

    fn element(&mut self, element: &str) {
        let hash = fnv1a_continue(self.set, element.as_bytes());
        self.sum = self.sum.wrapping_add(mix(hash));
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits: stable across builds and platforms (the digest outlives the process).
fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_continue(FNV_OFFSET, bytes)
}

fn fnv1a_continue(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// A 64-bit finaliser (MurmurHash3's `fmix64`): FNV-1a alone is close to linear in its
/// last bytes, and a sum of such hashes would let two swapped digits cancel out.
fn mix(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::desired::Protocol;
    use crate::netfilter::plan::{AddrPort, ClusterIpMasquerade};

    fn plan_with(ports: &[u16]) -> NetfilterPlan {
        let mut family = FamilyPlan::new(AddressFamily::V4, ClusterIpMasquerade::All);
        for port in ports {
            family.cluster_ips.insert(AddrPort {
                address: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)),
                protocol: Protocol::Tcp,
                port: *port,
            });
        }
        NetfilterPlan {
            v4: Some(family),
            v6: None,
        }
    }

    #[test]
    fn an_update_keeps_the_digest_of_the_whole_plan() {
        let options = RenderOptions::default();
        let before = plan_with(&[80, 443, 8080]);
        let after = plan_with(&[80, 8443, 9090]);
        let mut changes = PlanChanges {
            added: plan_with(&[8443, 9090]),
            removed: plan_with(&[443, 8080]),
        };
        let digest = plan_digest(&before, &options).unwrap();
        let updated = changed_digest(digest, &changes);
        assert_eq!(updated, plan_digest(&after, &options).unwrap());
        // An element added twice over is not the same plan.
        changes.removed = plan_with(&[]);
        assert_ne!(
            changed_digest(digest, &changes),
            plan_digest(&after, &options).unwrap()
        );
    }

    #[test]
    fn swapped_digits_options_and_rules_change_the_digest() {
        let options = RenderOptions::default();
        let digest =
            |plan: &NetfilterPlan, options: &RenderOptions| plan_digest(plan, options).unwrap();
        let base = digest(&plan_with(&[12, 21]), &options);
        assert_ne!(base, digest(&plan_with(&[11, 22]), &options));
        assert_ne!(base, digest(&plan_with(&[12]), &options));
        let renamed = RenderOptions {
            table_name: "other".to_owned(),
            ..RenderOptions::default()
        };
        assert_ne!(base, digest(&plan_with(&[12, 21]), &renamed));
        let mut other_rules = plan_with(&[12, 21]);
        other_rules.v4.as_mut().unwrap().cluster_ip_masquerade = ClusterIpMasquerade::NodeFromVip;
        assert_ne!(base, digest(&other_rules, &options));
        // Many single-element plans: no two collide.
        let digests: BTreeSet<u64> = (0..5000u16)
            .map(|port| digest(&plan_with(&[port]), &options))
            .collect();
        assert_eq!(digests.len(), 5000);
    }

    #[test]
    fn the_rendered_digest_is_read_back() {
        let options = RenderOptions::default();
        let plan = plan_with(&[80]);
        let digest = 0x0123_4567_89ab_cdef;
        let script = render_digest(&plan, &options, digest);
        assert!(script.contains("flush set ip"), "{script}");
        // As `nft list set` prints it.
        let listing = "table ip ipvs-proxier {\n\tset plan-digest {\n\t\ttype mark . mark\n\t\telements = { 0x01234567 . 0x89abcdef }\n\t}\n}\n";
        assert_eq!(parse_digest(listing), Some(digest));
        assert_eq!(
            parse_digest("table ip t {\n set plan-digest {\n type mark . mark\n }\n}"),
            None
        );
        assert_eq!(parse_digest("elements = { 0x1 . 0x2, 0x3 . 0x4 }"), None);
    }
}
