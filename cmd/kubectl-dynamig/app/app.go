// Package app is `kubectl dynamig`: what dynamig did, read from the cluster — per GPU the
// slot map of MIG reservations and the room left per profile (`nodes`), the GPU pods and the
// state of their reservations (`pods`), the namespaces' GPU quota use (`quotas`), and the
// built-in GPU model table (`models`).
package app

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/inspect"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
	"github.com/dynamig/dynamig/version"
)

// Output formats (-o).
const (
	outputTable = "table"
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// options are the flags every subcommand shares.
type options struct {
	config    *genericclioptions.ConfigFlags
	streams   genericiooptions.IOStreams
	output    string
	namespace string
	resource  string
	// schedulerConfig and deviceConfigFile override the cluster's ConfigMaps (explain, simulate).
	schedulerConfig, deviceConfigFile string
	// now is the clock ages and heartbeats are read against (tests fix it).
	now func() time.Time
}

// NewCommand returns `kubectl dynamig` writing to streams.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{config: genericclioptions.NewConfigFlags(true), streams: streams, now: time.Now}
	root := &cobra.Command{
		Use:           "kubectl-dynamig",
		Short:         "See what dynamig did: GPU slot maps, reservations, the GPU model table",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(c *cobra.Command, _ []string) error {
			if version.Requested(c) {
				fmt.Fprintln(c.OutOrStdout(), version.Get().String("kubectl-dynamig"))
				return nil
			}
			return c.Help()
		},
	}
	version.AddFlag(root)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.config.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVarP(&o.output, "output", "o", outputTable, "output format: table, wide, json or yaml")
	root.PersistentFlags().StringVar(&o.namespace, "dynamig-namespace", api.DefaultSystemNamespace, "where dynamig is installed (the chart's release namespace): the device plugins' heartbeat Leases and the ConfigMaps dynamig-device-config and dynamig-scheduler-config")
	root.PersistentFlags().StringVar(&o.resource, "resource-name", "", "the GPU count resource that makes a pod a GPU pod (default: the scheduler config's resourceCountName; nodes and pods: "+api.ResourceCount+")")
	root.PersistentFlags().StringVar(&o.schedulerConfig, "scheduler-config", "", "explain and simulate: a KubeSchedulerConfiguration file to take DynamicMIG's args from, instead of the cluster's ConfigMap dynamig-scheduler-config")
	root.PersistentFlags().StringVar(&o.deviceConfigFile, "device-config", "", "explain and simulate: a device-config.yaml to use instead of the cluster's ConfigMap dynamig-device-config")
	root.AddCommand(o.nodesCommand(), o.podsCommand(), o.quotasCommand(), o.explainCommand(), o.simulateCommand(), o.modelsCommand())
	return root
}

func (o *options) validOutput() error {
	switch o.output {
	case outputTable, outputWide, outputJSON, outputYAML:
		return nil
	}
	return fmt.Errorf("--output %q: want table, wide, json or yaml", o.output)
}

// objects are the cluster objects the views are built from.
type objects struct {
	client kubernetes.Interface
	nodes  []v1.Node
	pods   []v1.Pod
	leases []coordinationv1.Lease
}

// read lists every node, pod and heartbeat Lease.
func (o *options) read(ctx context.Context) (*objects, error) {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	leases, err := client.CoordinationV1().Leases(o.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the heartbeat Leases in %s: %w", o.namespace, err)
	}
	return &objects{client: client, nodes: nodes.Items, pods: pods.Items, leases: leases.Items}, nil
}

// snapshot reads the cluster's GPU side.
func (o *options) snapshot(ctx context.Context) (*inspect.Cluster, error) {
	obj, err := o.read(ctx)
	if err != nil {
		return nil, err
	}
	return inspect.Build(obj.nodes, obj.pods, obj.leases, v1.ResourceName(cmp.Or(o.resource, api.ResourceCount)), o.now()), nil
}

// colour is whether to paint the tables: only on a terminal, and not with NO_COLOR set or
// TERM=dumb.
func (o *options) colour() palette {
	f, ok := o.streams.Out.(*os.File)
	return palette(ok && term.IsTerminal(int(f.Fd())) && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb")
}

// print writes v as JSON or YAML; ok is false for the table formats.
func (o *options) print(v any) (ok bool, err error) {
	switch o.output {
	case outputJSON:
		raw, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintf(o.streams.Out, "%s\n", raw)
		return true, err
	case outputYAML:
		raw, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = o.streams.Out.Write(raw)
		return true, err
	}
	return false, nil
}

func (o *options) nodesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "nodes [NODE...]",
		Short: "Per GPU: the slot map (which pod holds which placement, with its profile), the room left per profile, hami-core shares, the heartbeat",
		RunE: func(c *cobra.Command, names []string) error {
			if err := o.validOutput(); err != nil {
				return err
			}
			cl, err := o.snapshot(c.Context())
			if err != nil {
				return err
			}
			nodes := cl.Nodes
			if len(names) > 0 {
				nodes = slices.DeleteFunc(slices.Clone(nodes), func(n inspect.Node) bool { return !slices.Contains(names, n.Name) })
				for _, name := range names {
					if !slices.ContainsFunc(nodes, func(n inspect.Node) bool { return n.Name == name }) {
						return fmt.Errorf("node %q publishes no GPU inventory and has no dynamig heartbeat (not a dynamig GPU node, or no such node)", name)
					}
				}
			}
			if ok, err := o.print(map[string]any{"nodes": nodes}); ok {
				return err
			}
			return writeNodes(o.streams.Out, nodes, o.output == outputWide, o.now(), o.colour())
		},
	}
}

// namespacedCommand is a command that shows one namespace (kubectl's -n, or the context's), or
// every namespace with -A: run gets the namespace, "" for all.
func (o *options) namespacedCommand(use, short, allHelp string, run func(ctx context.Context, ns string) error) *cobra.Command {
	var all bool
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.validOutput(); err != nil {
				return err
			}
			ns := ""
			if !all {
				var err error
				if ns, _, err = o.config.ToRawKubeConfigLoader().Namespace(); err != nil {
					return err
				}
			}
			return run(c.Context(), ns)
		},
	}
	c.Flags().BoolVarP(&all, "all-namespaces", "A", false, allHelp)
	return c
}

func (o *options) podsCommand() *cobra.Command {
	return o.namespacedCommand("pods", "GPU pods with their reservations and realisation state (reserved, realised with the MIG UUID, failed with the reason)",
		"GPU pods of every namespace", func(ctx context.Context, ns string) error {
			cl, err := o.snapshot(ctx)
			if err != nil {
				return err
			}
			pods := cl.Pods
			if ns != "" {
				pods = slices.DeleteFunc(slices.Clone(pods), func(p inspect.Pod) bool { return p.Namespace != ns })
			}
			if ok, err := o.print(map[string]any{"pods": pods}); ok {
				return err
			}
			return writePods(o.streams.Out, pods, ns == "", o.output == outputWide, o.now(), o.colour())
		})
}

func (o *options) quotasCommand() *cobra.Command {
	return o.namespacedCommand("quotas", "Namespace GPU quotas (ResourceQuotas with limits.nvidia.com/gpumem or limits.nvidia.com/gpucores): what the namespace's pods are granted against each limit",
		"quotas of every namespace", func(ctx context.Context, ns string) error {
			obj, err := o.read(ctx)
			if err != nil {
				return err
			}
			// Listed here too: a quota that may not be read is an error for this command.
			quotas, err := obj.client.CoreV1().ResourceQuotas(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("listing ResourceQuotas: %w", err)
			}
			policy, _, err := o.policy(ctx, obj.client, "")
			if err != nil {
				return err
			}
			rows := inspect.Quotas(obj.nodes, obj.pods, quotas.Items, quota.NamesOf(policy.Args.ResourceMemoryName, policy.Args.ResourceCoreName))
			if ns != "" {
				rows = slices.DeleteFunc(rows, func(r inspect.QuotaUse) bool { return r.Namespace != ns })
			}
			if ok, err := o.print(map[string]any{"quotas": rows}); ok {
				return err
			}
			return writeQuotas(o.streams.Out, rows, o.colour())
		})
}

func (o *options) explainCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "explain POD",
		Short: "Per node, whether the pod's GPU request fits now and, if not, why: dynamig's Filter (heartbeat, inventory, the allocator) on the cluster's current state",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.validOutput(); err != nil {
				return err
			}
			ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				return err
			}
			obj, err := o.read(c.Context())
			if err != nil {
				return err
			}
			i := slices.IndexFunc(obj.pods, func(p v1.Pod) bool { return p.Namespace == ns && p.Name == args[0] })
			if i < 0 {
				return fmt.Errorf("pod %s/%s not found", ns, args[0])
			}
			pod := &obj.pods[i]
			policy, source, err := o.policy(c.Context(), obj.client, pod.Spec.SchedulerName)
			if err != nil {
				return err
			}
			e, err := inspect.Explain(pod, obj.nodes, obj.pods, obj.leases, policy, o.now())
			if err != nil {
				return err
			}
			if ok, err := o.print(map[string]any{"pod": ns + "/" + pod.Name, "node": pod.Spec.NodeName, "policy": source, "refusal": e.Refusal, "nodes": e.Nodes}); ok {
				return err
			}
			return writeExplain(o.streams.Out, pod, source, e, o.colour())
		},
	}
}

// policy is what the scheduler decides with: DynamicMIG's args and the device config, each
// from the file given (--scheduler-config, --device-config), else from the cluster's
// ConfigMap (the chart's dynamig-scheduler-config and dynamig-device-config in
// --dynamig-namespace; client nil: none is read), else the shipped defaults, with the
// cluster's ResourceQuotas (GPU quotas; none when they may not be read). schedulerName picks
// the profile; source says where each came from.
func (o *options) policy(ctx context.Context, client kubernetes.Interface, schedulerName string) (*inspect.Policy, string, error) {
	schedRaw, schedFrom, err := o.configSource(ctx, client, o.schedulerConfig, "dynamig-scheduler-config", "config.yaml")
	if err != nil {
		return nil, "", err
	}
	devRaw, devFrom, err := o.configSource(ctx, client, o.deviceConfigFile, "dynamig-device-config", "device-config.yaml")
	if err != nil {
		return nil, "", err
	}
	p := &inspect.Policy{}
	if schedRaw == nil {
		p.Args = &config.DynamicMIGArgs{}
		p.Args.SetDefaults()
		schedFrom = "the shipped scheduler config"
	} else {
		p.Args, err = config.DynamicMIGArgsOf(schedRaw, schedulerName)
		if err != nil && schedulerName != "" {
			// A pod naming another scheduler (the webhook renames GPU pods): the profile that
			// configures DynamicMIG.
			p.Args, err = config.DynamicMIGArgsOf(schedRaw, "")
		}
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", schedFrom, err)
		}
	}
	if devRaw == nil {
		p.Device = config.DefaultDeviceConfig()
		devFrom = "HAMi v2.10's default device config"
	} else if p.Device, err = config.ParseDeviceConfig(devRaw); err != nil {
		return nil, "", fmt.Errorf("%s: %w", devFrom, err)
	}
	if o.resource != "" {
		p.Args.ResourceCountName = o.resource
	}
	// The namespaces' GPU quotas refuse as the scheduler does (not readable: none applied).
	if client != nil {
		quotas, err := client.CoreV1().ResourceQuotas(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		switch {
		case err == nil:
			p.Quotas = quotas.Items
		case !apierrors.IsForbidden(err):
			return nil, "", fmt.Errorf("listing ResourceQuotas: %w", err)
		}
	}
	return p, schedFrom + " and " + devFrom, nil
}

// configSource reads a config from file when given, else from key of the ConfigMap name in
// --dynamig-namespace; nil when neither is there (or the ConfigMap may not be read).
func (o *options) configSource(ctx context.Context, client kubernetes.Interface, file, name, key string) ([]byte, string, error) {
	if file != "" {
		raw, err := os.ReadFile(file)
		return raw, file, err
	}
	if client == nil {
		return nil, "", nil
	}
	cm, err := client.CoreV1().ConfigMaps(o.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	raw, ok := cm.Data[key]
	if !ok {
		return nil, "", fmt.Errorf("ConfigMap %s/%s has no key %s", o.namespace, name, key)
	}
	return []byte(raw), "ConfigMap " + o.namespace + "/" + name, nil
}

func (o *options) modelsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "models",
		Short: "The built-in GPU model table: profiles, memory, slices, placements, instance counts, the default allowlist",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.validOutput(); err != nil {
				return err
			}
			models := modelTable()
			source := "the cluster's nodes"
			if err := o.countModels(c.Context(), models); err != nil {
				source = "no cluster read: " + err.Error()
				fmt.Fprintf(o.streams.ErrOut, "Warning: which models the cluster's nodes have is not shown: %v\n", err)
			}
			if ok, err := o.print(map[string]any{"models": models, "inCluster": source}); ok {
				return err
			}
			return writeModels(o.streams.Out, models, o.output == outputWide)
		},
	}
}

// countModels fills each model's GPUs per node from the nodes' inventories.
func (o *options) countModels(ctx context.Context, models []model) error {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for i := range models {
		models[i].InCluster = []nodeGPUs{}
	}
	for _, n := range nodes.Items {
		gpus, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
		if err != nil {
			continue
		}
		for _, g := range gpus {
			m, ok := config.LookupModel(g.Type)
			if !ok {
				continue
			}
			i := slices.IndexFunc(models, func(x model) bool { return x.Model == m.Key })
			if i < 0 {
				continue
			}
			in := &models[i].InCluster
			if k := slices.IndexFunc(*in, func(x nodeGPUs) bool { return x.Node == n.Name }); k >= 0 {
				(*in)[k].GPUs++
			} else {
				*in = append(*in, nodeGPUs{Node: n.Name, GPUs: 1})
			}
		}
	}
	return nil
}

// Main runs the command with args; the exit status is 0, or 1 with the error on stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := NewCommand(genericiooptions.IOStreams{In: nil, Out: stdout, ErrOut: stderr})
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "Error:", err)
		return 1
	}
	return 0
}
