# kube-proxy's IPVS-mode netfilter footprint on a node, as its current source
# (pkg/proxy/ipvs/proxier.go and ipset.go, with KUBE-IPVS-OUT-FILTER) builds it: every ipset of
# its ipsetInfo table, its nat and filter chains, the jump rules it prepends to
# the built-in chains, the rules of writeIptablesRules, and its canary chain;
# beside them the kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY).
#
# Variables: IPT (iptables-legacy or iptables-nft), CLUSTER_CIDR, and the set
# contents as newline-separated lines: CLUSTER_IPS ("ip,tcp:port"),
# LOOP_BACK ("ip,tcp:port,ip"), NODE_PORTS_TCP ("port"), IPVS_IPS ("ip").
set -euo pipefail

# kube-proxy's sets (ensureIPSet: one create per ipsetInfo entry, then the
# entries), here in one `ipset restore`: the kernel ends up the same.
{
    for set in KUBE-LOOP-BACK:hash:ip,port,ip KUBE-CLUSTER-IP:hash:ip,port \
        KUBE-EXTERNAL-IP:hash:ip,port KUBE-EXTERNAL-IP-LOCAL:hash:ip,port \
        KUBE-LOAD-BALANCER:hash:ip,port KUBE-LOAD-BALANCER-FW:hash:ip,port \
        KUBE-LOAD-BALANCER-LOCAL:hash:ip,port KUBE-LOAD-BALANCER-SOURCE-IP:hash:ip,port,ip \
        KUBE-LOAD-BALANCER-SOURCE-CIDR:hash:ip,port,net KUBE-NODE-PORT-SCTP-HASH:hash:ip,port \
        KUBE-NODE-PORT-LOCAL-SCTP-HASH:hash:ip,port KUBE-IPVS-IPS:hash:ip; do
        echo "create ${set%%:*} ${set#*:} family inet hashsize 1024 maxelem 65536 comment"
    done
    for set in KUBE-NODE-PORT-TCP KUBE-NODE-PORT-LOCAL-TCP KUBE-NODE-PORT-UDP \
        KUBE-NODE-PORT-LOCAL-UDP KUBE-HEALTH-CHECK-NODE-PORT; do
        echo "create $set bitmap:port range 0-65535 comment"
    done
    entries() { while read -r entry; do [ -n "$entry" ] && echo "add $1 $entry"; done; }
    entries KUBE-CLUSTER-IP <<<"$CLUSTER_IPS"
    entries KUBE-LOOP-BACK <<<"$LOOP_BACK"
    entries KUBE-NODE-PORT-TCP <<<"$NODE_PORTS_TCP"
    entries KUBE-IPVS-IPS <<<"$IPVS_IPS"
} | ipset restore

# The kubelet's chains (there before kube-proxy starts), then kube-proxy's
# canary, its chains (createAndLinkKubeChain) and the jumps it prepends to the
# built-in chains (EnsureRule Prepend: the last one ends up first). One
# `iptables-restore --noflush` instead of one call per chain and rule.
"$IPT-restore" --noflush <<EOF
*mangle
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*nat
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
*filter
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-I INPUT -j KUBE-FIREWALL
-I OUTPUT -j KUBE-FIREWALL
-I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-I INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-I FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-I INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-I OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
COMMIT
EOF

# writeIptablesRules, for sets that are not empty (one restore per table, as kube-proxy).
"$IPT-restore" --noflush <<EOF
*nat
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s $CLUSTER_CIDR -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
*filter
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
COMMIT
EOF
