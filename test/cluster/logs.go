package cluster

import (
	"flag"
	"io"

	"k8s.io/klog/v2"
)

// QuietLogs keeps the components' klog output (API server, scheduler, device plugins) off
// a test's output unless verbose, when it goes to stderr; call it from TestMain after
// flag.Parse. Never to files: klog writes log files into the temporary directory when not
// told to write to stderr or elsewhere (seen: <binary>.<host>.root.log.* left in /tmp by -v
// runs).
func QuietLogs(verbose bool) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if verbose {
		_ = fs.Set("logtostderr", "true")
		return
	}
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}
