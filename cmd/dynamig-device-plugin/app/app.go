// Package app holds the dynamig-device-plugin commands.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/utils/clock"

	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml"
	"github.com/dynamig/dynamig/nvml/gonvml"
	"github.com/dynamig/dynamig/nvml/sim"
	"github.com/dynamig/dynamig/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	// exitUsage is for bad flags and bad input (an unknown model, an invalid config).
	exitUsage = 2
)

// usageError marks an error the user can fix by changing the command line or its input.
type usageError struct{ error }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	return MainContext(context.Background(), args, stdout, stderr)
}

// Option changes how MainContext runs the commands.
type Option func(*options)

type options struct {
	lib   nvml.Interface
	clock clock.PassiveClock
}

// WithNVML makes the commands use lib (already initialised) instead of the one --nvml
// selects: a sandbox keeps one simulated machine per node across device-plugin restarts,
// as real GPUs outlive the plugin.
func WithNVML(lib nvml.Interface) Option { return func(o *options) { o.lib = lib } }

// WithClock gives the daemon the node's clock (its heartbeat's renew times): a sandbox
// skews a node's clock against the scheduler's.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.clock = c } }

// MainContext is Main ending when ctx does (besides SIGINT and SIGTERM), for running the
// device plugin inside another process (the sandbox, end-to-end tests).
func MainContext(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	root := newRootCommand(stdout, stderr, &o)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	if errors.As(err, new(usageError)) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitError
}

func newRootCommand(stdout, stderr io.Writer, o *options) *cobra.Command {
	root := &cobra.Command{
		Use:           "dynamig-device-plugin",
		Short:         "dynamig's node agent: publishes the GPU inventory and realises MIG reservations",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// Without a subcommand: --version, else the help.
	root.RunE = func(c *cobra.Command, _ []string) error {
		if version.Requested(c) {
			fmt.Fprintln(c.OutOrStdout(), version.Get().String("dynamig-device-plugin"))
			return nil
		}
		return c.Help()
	}
	version.AddFlag(root)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newDiscoverCommand(o), newRunCommand(o))
	return root
}

// usageArgs marks a positional-argument error as a usage error.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// configFlags name the device config and the node config file, which both commands read.
type configFlags struct {
	deviceConfig, nodeConfig string
}

func (f *configFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.deviceConfig, "config", "", "device-config.yaml (HAMi's device ConfigMap content); default: HAMi v2.10's defaults")
	cmd.Flags().StringVar(&f.nodeConfig, "node-config", "", `per-node settings in HAMi's device-plugin form, {"nodeconfig": [...]} (JSON or YAML), merged over --config's; a node configured in both is an error`)
}

// load reads the device config and merges the node config file into it; a bad file is a
// usage error.
func (f *configFlags) load() (*config.DeviceConfig, error) {
	cfg, err := config.LoadDeviceConfig(f.deviceConfig)
	if err == nil {
		err = cfg.LoadNodeConfig(f.nodeConfig)
	}
	if err != nil {
		return nil, usageError{err}
	}
	return cfg, nil
}

// nvmlFlags selects and builds the NVML backend.
type nvmlFlags struct {
	backend  string
	simGPUs  string
	simState string
	// given replaces the flags' choice (WithNVML).
	given nvml.Interface
}

func (f *nvmlFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.backend, "nvml", "real", `NVML backend: "real" (libnvidia-ml through go-nvml) or "sim" (simulated GPUs, see --sim-gpus)`)
	cmd.Flags().StringVar(&f.simGPUs, "sim-gpus", "", "with --nvml=sim: the simulated GPUs as MODEL[:COUNT],... where MODEL is a model key (A100-40GB) or an NVML name (NVIDIA A100-PCIE-40GB); MIG mode is on, except on a node that nodeconfig makes hami-core")
	cmd.Flags().StringVar(&f.simState, "sim-state", "", "with --nvml=sim: a file that keeps the simulated GPUs' MIG mode and instances across restarts of the plugin, as real GPUs keep theirs (read at start when it exists, rewritten at every change); empty: they live as long as the process")
}

// open validates the flags and returns an initialised library; seed makes simulated UUIDs
// stable per node, and the simulated GPUs of a node configured hami-core start with MIG mode
// off, as its admin leaves them (the others with MIG mode on).
func (f *nvmlFlags) open(seed string, node config.NodeConfig) (nvml.Interface, error) {
	if f.given != nil {
		return noShutdown{f.given}, nil
	}
	var lib nvml.Interface
	switch f.backend {
	case "real":
		if f.simGPUs != "" || f.simState != "" {
			return nil, usagef("--sim-gpus and --sim-state need --nvml=sim")
		}
		lib = gonvml.New()
	case "sim":
		if f.simGPUs == "" {
			return nil, usagef("--nvml=sim needs --sim-gpus, e.g. --sim-gpus=A100-40GB:2,H100-80GB:1")
		}
		specs, err := sim.ParseGPUList(f.simGPUs)
		if err != nil {
			return nil, usagef("--sim-gpus: %v", err)
		}
		sim.SetMIGModeFor(specs, node.OperatingMode)
		s, err := sim.New(sim.Options{Seed: seed, StateFile: f.simState}, specs...)
		if err != nil {
			return nil, usagef("--sim-gpus, --sim-state: %v", err)
		}
		lib = s
	default:
		return nil, usagef(`--nvml must be "real" or "sim", not %q`, f.backend)
	}
	if err := lib.Init(); err != nil {
		return nil, err
	}
	return lib, nil
}

// noShutdown leaves a given library open when the command ends: its owner closes it.
type noShutdown struct{ nvml.Interface }

func (noShutdown) Shutdown() error { return nil }

// defaultNodeName is what a DaemonSet pod passes as NODE_NAME, else the host name.
func defaultNodeName() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return ""
}
