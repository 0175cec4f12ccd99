package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/test/cluster/controllermanager"
	"github.com/dynamig/dynamig/test/kubeletnode"
	"github.com/dynamig/dynamig/test/sandbox"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2 // bad flags or a bad config
)

const usage = `Usage:
  dynamig-sandbox [flags]         run the sandbox cluster until SIGINT or SIGTERM
  dynamig-sandbox demo [flags]    run the example pods on the default world, print what they got, stop

`

// run is the command line; ctx ends on SIGINT or SIGTERM.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "demo" {
		return runDemo(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("dynamig-sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "sandbox config (YAML): nodes: [{name, mode: mig|hami-core, gpus: [MODEL, ...]}], deviceConfig: PATH; default: the seed's world (mig-node with an NVIDIA A100-PCIE-40GB, core-node with an A100-40GB in hami-core mode)")
	kubeconfigOut := fs.String("kubeconfig-out", "", "also write the admin kubeconfig here (for kubectl and client-go)")
	stateOut := fs.String("state-out", "", "write the sandbox's state here as JSON once ready: {apiserver, kubeconfig, schedulerMetrics, nodes: {NAME: {deviceMetrics, mode, gpus}}}")
	install, kubelet, verbosity := commonFlags(fs)
	if code, ok := parseFlags(fs, args, stderr, "Flags:"); !ok {
		return code
	}
	cfg := sandboxconfig.DefaultConfig()
	if *configPath != "" {
		c, err := sandboxconfig.LoadConfig(*configPath)
		if err != nil {
			fmt.Fprintf(stderr, "Error: %v\n", err)
			return exitUsage
		}
		cfg = *c
	}
	logw := setupLogging(*verbosity, stderr)
	start := time.Now()
	s, code := startSandbox(ctx, cfg, *install, *kubelet, logw, stderr)
	if s == nil {
		return code
	}
	defer s.Stop()
	kubeconfig := s.Kubeconfig()
	if *kubeconfigOut != "" {
		if err := copyFile(s.Kubeconfig(), *kubeconfigOut); err != nil {
			fmt.Fprintf(stderr, "Error: --kubeconfig-out: %v\n", err)
			return exitError
		}
		kubeconfig, _ = filepath.Abs(*kubeconfigOut)
	}
	if *stateOut != "" {
		data, err := json.MarshalIndent(s.State(kubeconfig), "", "  ")
		if err == nil {
			err = os.WriteFile(*stateOut, append(data, '\n'), 0o600)
		}
		if err != nil {
			fmt.Fprintf(stderr, "Error: --state-out: %v\n", err)
			return exitError
		}
	}
	fmt.Fprintf(stderr, "dynamig-sandbox: ready in %s: API server %s, kubeconfig %s\n", time.Since(start).Round(10*time.Millisecond), s.APIServer(), kubeconfig)
	for _, n := range s.Nodes() {
		fmt.Fprintf(stderr, "  node %s (%s): %s, device plugin metrics %s\n", n.Name, n.Mode, strings.Join(n.GPUs, ", "), n.DeviceMetrics)
	}
	fmt.Fprintf(stderr, "  scheduler metrics %s\n", s.SchedulerMetrics())
	fmt.Fprintln(stdout, "ready")
	<-ctx.Done()
	fmt.Fprintln(stderr, "dynamig-sandbox: stopping")
	return exitOK
}

// startSandbox starts the sandbox; on failure it reports and returns the exit code.
func startSandbox(ctx context.Context, cfg sandboxconfig.Config, install, kubelet string, logw io.Writer, stderr io.Writer) (*sandbox.Sandbox, int) {
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return nil, exitUsage
	}
	if _, err := os.Stat(install); err != nil {
		fmt.Fprintf(stderr, "Error: --install: %v (run from the repository root, or name the file)\n", err)
		return nil, exitUsage
	}
	if err := kubeletnode.CheckIsolation(); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return nil, exitError
	}
	s, err := sandbox.Start(ctx, sandbox.Options{Config: cfg, Install: install, Log: logw, Kubelet: kubelet,
		Controllers: controllermanager.Start})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			fmt.Fprintln(stderr, "dynamig-sandbox: interrupted while starting")
			return nil, exitError
		}
		fmt.Fprintf(stderr, "Error: starting the sandbox: %v\n", err)
		if strings.Contains(err.Error(), "sandbox config") {
			return nil, exitUsage
		}
		return nil, exitError
	}
	return s, exitOK
}

// verbosityFlag is -v (logs on, klog level 0) or -v=N (klog level N); unset is quiet.
type verbosityFlag struct {
	set   bool
	level int
}

func (v *verbosityFlag) String() string {
	if v == nil || !v.set {
		return ""
	}
	return strconv.Itoa(v.level)
}

func (v *verbosityFlag) Set(s string) error {
	switch s {
	case "true":
		v.set, v.level = true, 0
		return nil
	case "false":
		v.set = false
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want -v or -v=N with N a whole number, not %q", s)
	}
	v.set, v.level = true, n
	return nil
}

func (v *verbosityFlag) IsBoolFlag() bool { return true }

// setupLogging points klog (the API server, scheduler, device plugins)
// at stderr when verbose, else nowhere; it returns the writer for the components' own
// output.
func setupLogging(v verbosityFlag, stderr io.Writer) io.Writer {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	if !v.set {
		klog.SetOutput(io.Discard)
		return io.Discard
	}
	_ = fs.Set("v", strconv.Itoa(v.level))
	klog.SetOutput(stderr)
	return stderr
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o600)
}

// prettyJSON indents a JSON document; anything else is returned as it is.
func prettyJSON(raw string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(raw), "", "  "); err != nil {
		return raw
	}
	return b.String()
}

// commonFlags are the flags of both the sandbox and its demo.
func commonFlags(fs *flag.FlagSet) (install, kubelet *string, verbosity *verbosityFlag) {
	install = fs.String("install", sandbox.DefaultInstall, "the install manifest (rendered from the Helm chart): its RBAC, admission policies, webhook and scheduler configuration are applied, and the components run as its service accounts")
	kubelet = fs.String("kubelet", os.Getenv(kubeletnode.KubeletEnv), "the kubelet binary the nodes run (make builds bin/kubelet-<minor>; default $"+kubeletnode.KubeletEnv+", else built from this module, about a minute)")
	verbosity = &verbosityFlag{}
	fs.Var(verbosity, "v", "log to stderr (-v), at klog verbosity N (-v=N); default: quiet")
	return install, kubelet, verbosity
}

// parseFlags parses args; ok is false when the command must exit with code (help, a bad
// flag, a stray argument).
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, heading string) (code int, ok bool) {
	fs.Usage = func() {
		fmt.Fprint(stderr, usage, heading+"\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "Error: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return exitUsage, false
	}
	return exitOK, true
}
