// Command gendata writes the marketing demo's CSV to stdout: a year of
// daily spend, impressions, clicks, conversions and revenue for eight
// campaigns on six channels.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/runbox-dev/runbox/examples/marketing/demo"
)

func main() {
	seed := flag.Uint64("seed", 2025, "random seed; the same seed gives the same data")
	flag.Parse()
	if err := demo.GenerateCSV(os.Stdout, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "gendata:", err)
		os.Exit(1)
	}
}
