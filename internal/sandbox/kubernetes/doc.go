// Package kubernetes runs sandboxes as pods (SANDBOX_ENGINE=kubernetes).
//
// A sandbox is a pod of a runner image, locked down as the Docker
// engine's containers are (pod.go), in the namespace of the engine's
// settings. The executor talks to the pod's agent over the container's
// attached stdin and stdout, through the API server and the kubelet
// (client-go's remotecommand: WebSocket, SPDY where the server offers
// nothing else), so the sandbox needs no network: a NetworkPolicy denies
// it all. /data is an emptyDir the executor fills and collects over exec
// (files.go); no pod gets a host path.
package kubernetes
