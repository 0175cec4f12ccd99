package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
	"github.com/dynamig/dynamig/deviceplugin/daemon"
	"github.com/dynamig/dynamig/deviceplugin/metrics"
	"github.com/dynamig/dynamig/deviceplugin/podresources"
)

type runOptions struct {
	nvml           nvmlFlags
	config         configFlags
	nodeName       string
	kubeconfig     string
	socketDir      string
	checkpoint     string
	podResources   string
	cdiSpecDir     string
	leaseNamespace string
	reclaimUnknown bool
	hamiCoreDir    string
	metricsAddress string
	enableMIGMode  bool
}

func newRunCommand(opts *options) *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the device plugin on this node until SIGINT or SIGTERM",
		Long: `Publishes the node's GPU inventory, renews its heartbeat Lease, registers ` + api.ResourceCount + ` with
kubelet, and reclaims the instances of pods that ended. Allocate answers CDI device names; before
each container starts (PreStartContainer) it asks the kubelet's PodResources API whose devices they
are, checks that pod's signed reservation, creates or adopts its MIG instance and writes the CDI
spec the container runtime resolves the names against.`,
		Example: `  dynamig-device-plugin run --node-name "$NODE_NAME" --config /etc/dynamig/device-config.yaml
  dynamig-device-plugin run --nvml=sim --sim-gpus=A100-40GB:2 --kubeconfig kubeconfig --kubelet-socket-dir /tmp/dp --node-name n1`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.nvml.register(cmd)
	o.nvml.given = opts.lib
	f := cmd.Flags()
	o.config.register(cmd)
	f.StringVar(&o.nodeName, "node-name", defaultNodeName(), "this node's name (default: $NODE_NAME, else the host name)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; default: the in-cluster configuration")
	f.StringVar(&o.socketDir, "kubelet-socket-dir", pluginapi.DevicePluginPath, "kubelet's device-plugin socket directory")
	f.StringVar(&o.checkpoint, "checkpoint", "", "the plugin's checkpoint file (default: dynamig.checkpoint in --kubelet-socket-dir)")
	f.StringVar(&o.podResources, "pod-resources-socket", podresources.DefaultSocket, "the kubelet's PodResources API socket")
	f.StringVar(&o.cdiSpecDir, "cdi-spec-dir", cdi.DefaultSpecDir, "where the containers' CDI specs are written (the runtime's CDI spec directory)")
	f.StringVar(&o.leaseNamespace, "lease-namespace", api.DefaultSystemNamespace, "namespace of the heartbeat Leases and the reservation public keys")
	f.StringVar(&o.hamiCoreDir, "hami-core-host-dir", "/usr/local/vgpu", "host directory with HAMi-core's libvgpu.so and ld.so.preload, mounted into hami-core containers")
	f.StringVar(&o.metricsAddress, "metrics-bind-address", ":9394", "where to serve /metrics (empty: nowhere)")
	f.BoolVar(&o.enableMIGMode, "enable-mig-mode", false, "turn MIG mode on for GPUs of a mig node that have it off (it may need a GPU reset, which the plugin never does)")
	f.BoolVar(&o.reclaimUnknown, "reclaim-unknown-instances", false, "at start, destroy idle MIG instances that dynamig did not create (default: report them and leave them)")
	return cmd
}

func (o *runOptions) run(cmd *cobra.Command) error {
	if o.nodeName == "" {
		return usagef("--node-name is required (or NODE_NAME)")
	}
	cfg, err := o.config.load()
	if err != nil {
		return err
	}
	restConfig, err := o.restConfig()
	if err != nil {
		return usageError{err}
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	lib, err := o.nvml.open(o.nodeName, cfg.Node(o.nodeName))
	if err != nil {
		return err
	}
	defer func() { _ = lib.Shutdown() }()
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.FromContext(ctx)
	if o.metricsAddress != "" {
		srv := &http.Server{Addr: o.metricsAddress, Handler: promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		ln, err := net.Listen("tcp", o.metricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-bind-address %s: %w", o.metricsAddress, err)
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Metrics listener stopped")
			}
		}()
		defer func() {
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdown)
		}()
	}
	for _, w := range cfg.Warnings {
		logger.Info("Device config warning", "warning", w)
	}
	return daemon.Run(ctx, daemon.Options{NodeName: o.nodeName, Client: client, NVML: lib, DeviceConfig: cfg,
		SocketDir: o.socketDir, CheckpointPath: o.checkpoint, PodResourcesSocket: o.podResources, CDISpecDir: o.cdiSpecDir, LeaseNamespace: o.leaseNamespace, ReclaimUnknownInstances: o.reclaimUnknown, HAMiCoreHostDir: o.hamiCoreDir, EnableMIGMode: o.enableMIGMode})
}

func (o *runOptions) restConfig() (*rest.Config, error) {
	if o.kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	}
	return rest.InClusterConfig()
}
