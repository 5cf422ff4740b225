# kube-proxy's IPVS-mode netfilter footprint on a node, built the way its source
# (pkg/proxy/ipvs/proxier.go, ipset.go; release 1.31) builds it: every ipset of
# its ipsetInfo table, its nat and filter chains, the jump rules it prepends to
# the built-in chains, the rules of writeIptablesRules, and its canary chain;
# beside them the kubelet's chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY).
#
# Variables: IPT (iptables-legacy or iptables-nft), CLUSTER_CIDR, and the set
# contents as newline-separated lines: CLUSTER_IPS ("ip,tcp:port"),
# LOOP_BACK ("ip,tcp:port,ip"), NODE_PORTS_TCP ("port"), IPVS_IPS ("ip").
set -euo pipefail

# kube-proxy's sets (ensureIPSet: ipset create NAME TYPE ... comment).
hashset() { ipset create "$1" "$2" family inet hashsize 1024 maxelem 65536 comment; }
ports() { ipset create "$1" bitmap:port range 0-65535 comment; }
hashset KUBE-LOOP-BACK hash:ip,port,ip
hashset KUBE-CLUSTER-IP hash:ip,port
hashset KUBE-EXTERNAL-IP hash:ip,port
hashset KUBE-EXTERNAL-IP-LOCAL hash:ip,port
hashset KUBE-LOAD-BALANCER hash:ip,port
hashset KUBE-LOAD-BALANCER-FW hash:ip,port
hashset KUBE-LOAD-BALANCER-LOCAL hash:ip,port
hashset KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip
hashset KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net
ports KUBE-NODE-PORT-TCP
ports KUBE-NODE-PORT-LOCAL-TCP
ports KUBE-NODE-PORT-UDP
ports KUBE-NODE-PORT-LOCAL-UDP
hashset KUBE-NODE-PORT-SCTP-HASH hash:ip,port
hashset KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port
ports KUBE-HEALTH-CHECK-NODE-PORT
hashset KUBE-IPVS-IPS hash:ip
add() { local set=$1; while read -r entry; do [ -n "$entry" ] && ipset add "$set" "$entry"; done; }
add KUBE-CLUSTER-IP <<<"$CLUSTER_IPS"
add KUBE-LOOP-BACK <<<"$LOOP_BACK"
add KUBE-NODE-PORT-TCP <<<"$NODE_PORTS_TCP"
add KUBE-IPVS-IPS <<<"$IPVS_IPS"

# The kubelet's chains, there before kube-proxy starts.
for table in mangle nat filter; do "$IPT" -t "$table" -N KUBE-KUBELET-CANARY; done
"$IPT" -t filter -N KUBE-FIREWALL
"$IPT" -t filter -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 \
    -m comment --comment "block incoming localnet connections" \
    -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
"$IPT" -t filter -I INPUT -j KUBE-FIREWALL
"$IPT" -t filter -I OUTPUT -j KUBE-FIREWALL

# kube-proxy: its canary, its chains (createAndLinkKubeChain), the jumps.
for table in mangle nat filter; do "$IPT" -t "$table" -N KUBE-PROXY-CANARY; done
for chain in KUBE-SERVICES KUBE-POSTROUTING KUBE-NODE-PORT KUBE-LOAD-BALANCER KUBE-MARK-MASQ; do
    "$IPT" -t nat -N "$chain"
done
for chain in KUBE-FORWARD KUBE-NODE-PORT KUBE-PROXY-FIREWALL KUBE-SOURCE-RANGES-FIREWALL \
    KUBE-IPVS-FILTER KUBE-IPVS-OUT-FILTER; do
    "$IPT" -t filter -N "$chain"
done
jump() { "$IPT" -t "$1" -I "$2" -m comment --comment "$4" -j "$3"; }
jump nat OUTPUT KUBE-SERVICES "kubernetes service portals"
jump nat PREROUTING KUBE-SERVICES "kubernetes service portals"
jump nat POSTROUTING KUBE-POSTROUTING "kubernetes postrouting rules"
jump filter FORWARD KUBE-FORWARD "kubernetes forwarding rules"
jump filter INPUT KUBE-NODE-PORT "kubernetes health check rules"
jump filter INPUT KUBE-PROXY-FIREWALL "kube-proxy firewall rules"
jump filter FORWARD KUBE-PROXY-FIREWALL "kube-proxy firewall rules"
jump filter INPUT KUBE-IPVS-FILTER "kubernetes ipvs access filter"
jump filter OUTPUT KUBE-IPVS-OUT-FILTER "kubernetes ipvs access filter"

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
