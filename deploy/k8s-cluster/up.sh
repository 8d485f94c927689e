#!/bin/bash
# Starts the single-node test cluster, all its state under DIR: etcd, a
# containerd of its own, the control plane, a kubelet, kube-proxy
# (nftables), CoreDNS and kube-router's NetworkPolicy firewall, all as
# processes of this machine, offline (images are imported, never pulled).
# run.sh is how to use it: it takes the machine-wide lock first (one
# cluster a machine: kube-proxy and kube-router own names on the host that
# a second cluster would share) and stops it with down.sh, which restores
# what up.sh changed on the host. What a caller needs is written to
# DIR/cluster.env.
#
# Usage: up.sh DIR    (DIR need not exist)
#   K8S_KEEP_IMAGES=1   keep containerd's images in $K8S_CACHE between
#                       clusters (import.sh imports an image once)
#   K8S_POD_CIDR, K8S_SERVICE_CIDR (/24 each: 10.244.0.0/24, 10.96.0.0/24)
#   K8S_NODE_IP         the node's address (that of the default route)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
k8s_dirs
[ $# = 1 ] || die "usage: $0 DIR"
[ "$(id -u)" = 0 ] || die "k8s-cluster: runs as root (it sets up networks and cgroups)"
mkdir -p "$1"
dir=$(cd "$1" && pwd)

for f in "$KUBERNETES_DIR" "$CONTAINERD_DIR" "$RUNSC_SHIM_DIR" "$COREDNS_DIR" "$KUBE_ROUTER_DIR" "$ETCD_DIR" "$PAUSE_DIR"; do
  [ -f "$f/.done" ] || die "k8s-cluster: $f is missing: run \`make test-deps\` (deploy/k8s-cluster/install.sh)"
done
runc=$(command -v runc) || die "k8s-cluster: runc is missing: run \`make test-deps\` (deploy/deps.sh test)"
for c in ipset nft iptables-save; do
  command -v $c >/dev/null || die "k8s-cluster: $c is missing: run \`make test-deps\` (deploy/deps.sh test)"
done
[ -x /usr/lib/cni/bridge ] || die "k8s-cluster: the CNI plugins are missing: run \`make test-deps\` (deploy/deps.sh test)"

pod_cidr=${K8S_POD_CIDR:-10.244.0.0/24}
service_cidr=${K8S_SERVICE_CIDR:-10.96.0.0/24}
node_ip=${K8S_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
[ -n "$node_ip" ] || die "k8s-cluster: no address for the node: set K8S_NODE_IP"
svc_prefix=${service_cidr%.*/*}
api_service_ip=$svc_prefix.1
dns_service_ip=$svc_prefix.10
pod_gateway=${pod_cidr%.*/*}.1
node=runbox-node
bridge=runbox-k8s0
# The node-port range: kube-router lets every pod reach the node on it
# whatever the NetworkPolicy says, so it is kept small and away from the
# ports tests hand out (internal/testenv.FreePort: 20000-32000).
node_ports=32760-32767

# free_port VAR sets VAR to a TCP port in 16000-19999 that nothing uses
# and no other VAR has: below the ephemeral range and outside the tests'.
used=$(ss -Htan | awk '{n=split($4, a, ":"); print a[n]}' | sort -u)
free_port() {
  local p
  while :; do
    p=$((16000 + RANDOM % 4000))
    grep -qx "$p" <<<"$used" || break
  done
  used="$used"$'\n'"$p"
  printf -v "$1" %s "$p"
}
for v in api_port etcd_port etcd_peer_port kubelet_port proxy_healthz_port proxy_metrics_port dns_port; do
  free_port $v
done

mkdir -p "$dir"/{pki,conf/cni,logs,pids,before,etcd,kubelet,pod-logs,cni,containerd,runc,runsc,volume-plugins}
images=$dir/images
if [ "${K8S_KEEP_IMAGES:-}" = 1 ]; then
  images=$IMAGES_DIR
fi
mkdir -p "$images"
sock=$dir/containerd.sock
kubeconfig=$dir/conf/admin.kubeconfig

cat > "$dir/cluster.env" <<EOF
KUBECONFIG=$kubeconfig
K8S_API=https://$node_ip:$api_port
K8S_NODE=$node
K8S_NODE_IP=$node_ip
K8S_POD_CIDR=$pod_cidr
K8S_SERVICE_CIDR=$service_cidr
K8S_API_SERVICE_IP=$api_service_ip
K8S_DNS_SERVICE_IP=$dns_service_ip
K8S_BRIDGE=$bridge
K8S_CONTAINERD=$sock
K8S_IMAGES=$images
K8S_BIN=$KUBERNETES_DIR
K8S_CTR=$CONTAINERD_DIR/ctr
EOF

# What up.sh and its processes change on the host, as it was: down.sh
# puts it back.
sysctls="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables"
if [ ! -f "$dir/before/sysctl" ]; then
  for k in $sysctls; do echo "$k=$(sysctl -n "$k")"; done > "$dir/before/sysctl.tmp"
  mv "$dir/before/sysctl.tmp" "$dir/before/sysctl"
fi
if [ ! -f "$dir/before/absent" ]; then
  for p in /var/log/containers /var/log/pods /var/lib/kubelet /var/lib/cni /etc/cni /opt/cni /etc/kubernetes \
    /run/containerd /var/run/nri /usr/libexec/kubernetes /var/lib/containerd /run/runsc /var/run/netns \
    $(printf '%skubepods ' /sys/fs/cgroup/*/); do
    [ -e "$p" ] || echo "$p"
  done > "$dir/before/absent"
  ls /run/containerd/s 2>/dev/null > "$dir/before/shim-sockets" || true
fi
# Pods on the bridge are filtered by kube-router's iptables rules only
# when bridged traffic goes through iptables.
sysctl -qw net.bridge.bridge-nf-call-iptables=1

# --- certificates and kubeconfigs (EC keys: quick to make) ---
pki=$dir/pki
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# cert NAME SUBJECT [SAN]: a certificate signed by the cluster's CA.
cert() {
  key "$pki/$1.key"
  local ext="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  [ -n "${3:-}" ] && ext="$ext,serverAuth
subjectAltName=$3"
  openssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
    -extfile <(echo "$ext") -out "$pki/$1.crt" 2>/dev/null
  rm "$pki/$1.csr"
}
key "$pki/ca.key"
openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=runbox-test-cluster-ca" -days 30 -out "$pki/ca.crt" 2>/dev/null
key "$pki/sa.key"
openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
cert apiserver /CN=kube-apiserver \
  "IP:$node_ip,IP:127.0.0.1,IP:$api_service_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert admin "/O=system:masters/CN=runbox-test-admin"
cert controller-manager /CN=system:kube-controller-manager
cert scheduler /CN=system:kube-scheduler
cert kubelet "/O=system:nodes/CN=system:node:$node"
# kubeconfig NAME: the kubeconfig of the certificate NAME.
kubeconfig() {
  cat > "$dir/conf/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: runbox-test
  cluster:
    server: https://$node_ip:$api_port
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$pki/$1.crt")
    client-key-data: $(base64 -w0 "$pki/$1.key")
contexts:
- name: runbox-test
  context: {cluster: runbox-test, user: $1}
current-context: runbox-test
EOF
}
for k in admin controller-manager scheduler kubelet; do kubeconfig $k; done
log "k8s-cluster: certificates made"

# --- configuration ---
cat > "$dir/conf/containerd.toml" <<EOF
version = 3
root = "$images"
state = "$dir/containerd"
# The same as this process's, which is as low as it can be set without
# CAP_SYS_RESOURCE (which some machines' bounding set lacks).
oom_score = 0
# Plugins that would put sockets or files outside DIR, or that nothing
# here uses.
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  level = "warn"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    # Containers' oom_score_adj no lower than containerd's: lowering it
    # needs CAP_SYS_RESOURCE, without which runc fails every pod ("can't
    # get final child's PID from pipe: EOF").
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        runtime_path = "$CONTAINERD_DIR/containerd-shim-runc-v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$runc"
          Root = "$dir/runc"
          SystemdCgroup = false
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
        runtime_type = "io.containerd.runsc.v1"
        runtime_path = "$RUNSC_SHIM_DIR/containerd-shim-runsc-v1"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
          TypeUrl = "io.containerd.runsc.v1.options"
          ConfigPath = "$dir/conf/runsc.toml"
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "$dir/conf/cni"
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF

# gVisor for the RuntimeClass "runsc", as deploy/runsc.sh registers it
# with Docker: systrap, and no network stack in the sandbox.
runsc_args=""
[ "$(nproc)" -le 2 ] && runsc_args='  systrap-disable-fast-path = "true"'
cat > "$dir/conf/runsc.toml" <<EOF
binary_name = "$($GO env GOPATH)/bin/runsc"
root = "$dir/runsc"
[runsc_config]
  platform = "systrap"
  network = "none"
  host-uds = "open"
$runsc_args
EOF

cat > "$dir/conf/cni/10-runbox.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "runbox-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$pod_gateway"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF

cat > "$dir/conf/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
# These machines run cgroup v1, which Kubernetes 1.35 drops.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$sock
imageServiceEndpoint: unix://$sock
podLogsDir: $dir/pod-logs
volumePluginDir: $dir/volume-plugins
clusterDNS: [$dns_service_ip]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
protectKernelDefaults: false
makeIPTablesUtilChains: false
oomScoreAdj: 0
syncFrequency: 10s
nodeStatusUpdateFrequency: 10s
maxPods: 110
# What Docker bounds per sandbox and a pod cannot say (docs/kubernetes.md):
# the processes of each pod (a fork bomb stays in its pod, as under
# Docker's pids limit) and the log the kubelet keeps of each container's
# output, which for a sandbox is its agent's stream.
podPidsLimit: 256
containerLogMaxSize: 1Mi
containerLogMaxFiles: 2
EOF

cat > "$dir/conf/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
# Its own nftables tables, which down.sh deletes: no rule among Docker's.
mode: nftables
clientConnection: {kubeconfig: $kubeconfig}
hostnameOverride: $node
clusterCIDR: $pod_cidr
healthzBindAddress: 127.0.0.1:$proxy_healthz_port
metricsBindAddress: 127.0.0.1:$proxy_metrics_port
oomScoreAdj: 0
# 0: leave the host's conntrack settings alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF

cat > "$dir/conf/Corefile" <<EOF
.:$dns_port {
    bind $node_ip
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
}
EOF

# --- processes ---
# Every process carries RUNBOX_K8S_CLUSTER=DIR in its environment, which
# containerd hands to its shims: down.sh finds by it what it must stop and
# nothing else.
export RUNBOX_K8S_CLUSTER=$dir
export KUBECONFIG=$kubeconfig
kubectl=$KUBERNETES_DIR/kubectl
ctr() { "$CONTAINERD_DIR/ctr" -a "$sock" -n k8s.io "$@"; }

# start NAME CMD...: starts a process in a session of its own, its output
# in DIR/logs/NAME.log, its pid in DIR/pids/NAME.
start() {
  local name=$1
  shift
  PATH=$CONTAINERD_DIR:$PATH setsid "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$dir/pids/$name"
}
# wait_for WHAT SECONDS CMD...: until CMD succeeds; fails after SECONDS.
wait_for() {
  local what=$1 deadline=$((SECONDS + $2))
  shift 2
  until "$@" > /dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "k8s-cluster: $what did not come up (logs in $dir/logs)"
    sleep 0.2
  done
  log "k8s-cluster: $what up"
}

etcd_flags=""
"$ETCD_DIR/etcd" --help 2>&1 | grep -q -- --unsafe-no-fsync && etcd_flags=--unsafe-no-fsync
start etcd "$ETCD_DIR/etcd" --name runbox-test --data-dir "$dir/etcd" $etcd_flags \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "runbox-test=http://127.0.0.1:$etcd_peer_port" --log-level warn
start containerd "$CONTAINERD_DIR/containerd" -c "$dir/conf/containerd.toml"
wait_for containerd 60 ctr version
if ! ctr images ls -q | grep -qx "$PAUSE_IMAGE"; then
  ctr images import "$PAUSE_DIR/pause.tar" > /dev/null 2> "$dir/logs/import.log" ||
    die "k8s-cluster: the pause image's import failed: $(grep -v DEPRECATION "$dir/logs/import.log")"
fi
wait_for etcd 60 curl -sf "http://127.0.0.1:$etcd_port/health"

# Privileged pods allowed, as in most clusters: Pod Security admission is
# what keeps them out of a namespace (deploy/kubernetes).
start kube-apiserver "$KUBERNETES_DIR/kube-apiserver" --bind-address="$node_ip" --advertise-address="$node_ip" \
  --secure-port="$api_port" --etcd-servers="http://127.0.0.1:$etcd_port" \
  --service-cluster-ip-range="$service_cidr" --service-node-port-range="$node_ports" \
  --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$pki/apiserver-kubelet-client.key" --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
  --profiling=false --v=1
wait_for kube-apiserver 180 "$kubectl" get --raw /readyz

start kube-controller-manager "$KUBERNETES_DIR/kube-controller-manager" \
  --kubeconfig="$dir/conf/controller-manager.kubeconfig" --secure-port=0 --leader-elect=false \
  --use-service-account-credentials=true --service-account-private-key-file="$pki/sa.key" \
  --root-ca-file="$pki/ca.crt" --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  --allocate-node-cidrs=true --cluster-cidr="$pod_cidr" --node-cidr-mask-size=24 \
  --service-cluster-ip-range="$service_cidr" --profiling=false --v=1
start kube-scheduler "$KUBERNETES_DIR/kube-scheduler" --kubeconfig="$dir/conf/scheduler.kubeconfig" \
  --secure-port=0 --leader-elect=false --profiling=false --v=1
start kubelet "$KUBERNETES_DIR/kubelet" --config="$dir/conf/kubelet.yaml" \
  --kubeconfig="$dir/conf/kubelet.kubeconfig" --root-dir="$dir/kubelet" \
  --hostname-override="$node" --node-ip="$node_ip" --v=1
start kube-proxy "$KUBERNETES_DIR/kube-proxy" --config="$dir/conf/kube-proxy.yaml" --v=1
start coredns "$COREDNS_DIR/coredns" -conf "$dir/conf/Corefile"

# Cluster DNS: CoreDNS runs on the host, behind the kube-dns Service.
wait_for "the kube-system namespace" 120 "$kubectl" get namespace kube-system
"$kubectl" apply -f - > /dev/null <<EOF
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: $dns_service_ip
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $dns_port}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $dns_port}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns}
addressType: IPv4
ports:
- {name: dns, port: $dns_port, protocol: UDP}
- {name: dns-tcp, port: $dns_port, protocol: TCP}
endpoints:
- addresses: [$node_ip]
  conditions: {ready: true}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runsc}
handler: runsc
EOF

wait_for "node $node" 120 "$kubectl" get node "$node"
# kube-router finds the node it serves when it starts.
start kube-router "$KUBE_ROUTER_DIR/kube-router" --kubeconfig="$kubeconfig" --hostname-override="$node" \
  --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
  --enable-cni=false --health-port=0 --metrics-port=0 \
  --service-cluster-ip-range="$service_cidr" --service-node-port-range="$node_ports"
wait_for "node $node Ready" 180 "$kubectl" wait --for=condition=Ready "node/$node" --timeout=2s
wait_for "the default service account" 120 "$kubectl" get serviceaccount default -n default
# Services answer once kube-proxy has written them, and NetworkPolicy is
# enforced once kube-router has its chains.
wait_for "kube-proxy" 120 sh -c "nft list table ip kube-proxy | grep -q '$dns_service_ip'"
wait_for "kube-router" 120 iptables -S KUBE-ROUTER-FORWARD
wait_for "CoreDNS" 60 sh -c "ss -Hlun | grep -q '$node_ip:$dns_port'"
log "k8s-cluster: up: KUBECONFIG=$kubeconfig"
