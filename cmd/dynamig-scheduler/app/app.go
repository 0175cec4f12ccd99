// Package app builds the dynamig-scheduler command: kube-scheduler's own command with the
// DynamicMIG plugin registered, a version flag and the plugin's metrics listener.
package app

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/term"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	kubeapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/metricsserver"
	"github.com/dynamig/dynamig/plugins/dynamicmig"
	dynamigversion "github.com/dynamig/dynamig/version"
)

// Name is the command's name.
const Name = "dynamig-scheduler"

// flags are dynamig's own flags, next to kube-scheduler's.
type flags struct {
	// metricsBindAddress is where the DynamicMIG metrics (dynamicmig.Registry) are served.
	//
	// It takes precedence over the plugin args' metricsBindAddress: kube-scheduler's
	// app.Setup owns the parsing of the --config file and builds the plugins inside the
	// scheduler, so cmd never sees the decoded args before it has to open the listener; and
	// a process has one listener while a configuration may have several profiles, each with
	// its own args. The plugin factory only warns when the args name another address.
	metricsBindAddress string
}

func (f *flags) addTo(fss *cliflag.NamedFlagSets) {
	fs := fss.FlagSet("dynamig")
	fs.StringVar(&f.metricsBindAddress, "dynamig-metrics-bind-address", config.DefaultSchedulerMetricsAddress,
		"host:port where the DynamicMIG plugin's Prometheus metrics are served at /metrics (plain HTTP); empty disables. "+
			"Takes precedence over the DynamicMIG args' metricsBindAddress.")
}

// RegistryOptions are the out-of-tree plugins the command registers with kube-scheduler.
func RegistryOptions() []kubeapp.Option {
	return registryOptions(nil)
}

func registryOptions(f *flags) []kubeapp.Option {
	// dynamicmig.New takes the scheduler's feature gates, as in-tree plugins do; the
	// registry wants a plain PluginFactory. The Option runs inside app.Setup, after the
	// command line (--feature-gates) is parsed, so the gates read here are the final ones.
	return []kubeapp.Option{func(r frameworkruntime.Registry) error {
		fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
		return r.Register(dynamicmig.Name, frameworkruntime.FactoryAdapter(fts, newPlugin(f)))
	}}
}

// newPlugin is dynamicmig.New, warning when the args ask for a metrics address that the
// command does not serve (see flags.metricsBindAddress).
func newPlugin(f *flags) frameworkruntime.PluginFactoryWithFts[fwk.Plugin] {
	return func(ctx context.Context, obj runtime.Object, h fwk.Handle, fts feature.Features) (fwk.Plugin, error) {
		pl, err := dynamicmig.New(ctx, obj, h, fts)
		if err != nil || f == nil {
			return pl, err
		}
		if raw, ok := obj.(*runtime.Unknown); ok {
			if args, err := config.DecodeDynamicMIGArgs(raw.Raw); err == nil && args.MetricsBindAddress != f.metricsBindAddress {
				klog.FromContext(ctx).Info("Warning: the DynamicMIG args' metricsBindAddress is ignored; --dynamig-metrics-bind-address decides where the metrics are served",
					"profile", h.ProfileName(), "metricsBindAddress", args.MetricsBindAddress, "served", f.metricsBindAddress)
			}
		}
		return pl, nil
	}
}

// NewCommand returns kube-scheduler's command with DynamicMIG registered. Its --version
// (kube-scheduler's flag) prints dynamig's version, commit and the Kubernetes version.
func NewCommand() *cobra.Command {
	f := &flags{}
	cmd := kubeapp.NewSchedulerCommand(registryOptions(f)...)
	cmd.Use = Name
	cmd.Short = "kube-scheduler with the DynamicMIG plugin: reserves exact GPUs, MIG profiles and placements"
	cmd.Long = `dynamig-scheduler is kube-scheduler with all its default plugins plus DynamicMIG, which
reserves, for each GPU a pod asks for, an exact GPU, MIG profile and placement, and hands the
reservation to the node's dynamig-device-plugin on the Binding.
Run it with --config manifests/scheduler-config.yaml; pods choose it with
schedulerName: dynamig-scheduler. Every kube-scheduler flag works as upstream.`

	if h := cmd.Flags().Lookup("help"); h != nil {
		h.Usage = "help for " + Name
	}
	fss := cliflag.NamedFlagSets{}
	f.addTo(&fss)
	for _, fs := range fss.FlagSets {
		cmd.Flags().AddFlagSet(fs)
	}
	// kube-scheduler's help and usage print only its own flag sections; add dynamig's.
	cols, _, _ := term.TerminalSize(cmd.OutOrStdout())
	help, usage := cmd.HelpFunc(), cmd.UsageFunc()
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		help(c, args)
		cliflag.PrintSections(c.OutOrStdout(), fss, cols)
	})
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		err := usage(c)
		cliflag.PrintSections(c.OutOrStderr(), fss, cols)
		return err
	})

	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		// --version (kube-scheduler's verflag, true or raw) prints dynamig's line instead of
		// the Kubernetes version alone, before a listener is opened for nothing.
		if v := c.Flags().Lookup("version"); v != nil && v.Value.String() != "false" {
			fmt.Fprintln(c.OutOrStdout(), dynamigversion.Get().String(Name))
			return nil
		}
		ctx, cancel := context.WithCancel(c.Context())
		defer cancel()
		logger := klog.FromContext(ctx)
		info := dynamigversion.Get()
		logger.Info("Starting dynamig-scheduler", "version", info.Version, "commit", info.Commit, "kubernetes", info.Kubernetes)
		_, stopped, err := metricsserver.Serve(ctx, f.metricsBindAddress, "--dynamig-metrics-bind-address", dynamicmig.Registry, nil)
		if err != nil {
			return err
		}
		err = run(c, args)
		cancel()
		<-stopped
		return err
	}
	return cmd
}
