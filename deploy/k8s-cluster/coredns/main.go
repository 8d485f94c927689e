// Command coredns is CoreDNS with only the plugins the test cluster's
// DNS needs (deploy/k8s-cluster): the whole of CoreDNS brings in every
// cloud provider's SDK, minutes of build for nothing used here.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

// directives are the plugins a Corefile may use, in the order CoreDNS's
// own plugin.cfg runs them.
var directives = []string{
	"bind",
	"errors",
	"log",
	"cache",
	"kubernetes",
	"forward",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
