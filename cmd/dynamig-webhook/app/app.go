// Package app is the dynamig-webhook command: a controller-runtime manager that serves the
// webhook over TLS on every replica, with its serving certificate and CA kept in a Secret
// and injected into the MutatingWebhookConfiguration by cert-controller.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/version"
	dynamigwebhook "github.com/dynamig/dynamig/webhook"
	"github.com/dynamig/dynamig/webhook/mutation"
)

// Exit codes, as dynamig-device-plugin's.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Names of the objects the shipped manifest creates (manifests/webhook.yaml).
const (
	DefaultCertSecret           = "dynamig-webhook-cert"
	DefaultWebhookConfiguration = "dynamig-webhook"
	DefaultService              = "dynamig-webhook"
)

type usageError struct{ error }

// Options are the command's flags.
type Options struct {
	Kubeconfig     string
	DeviceConfig   string
	SchedulerName  string
	Replace        []string
	Namespace      string
	CertSecret     string
	Configuration  string
	DNSName        string
	ExtraDNSNames  []string
	CertDir        string
	BindAddress    string
	HealthAddress  string
	MetricsAddress string
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	return MainContext(context.Background(), args, stdout, stderr)
}

// MainContext is Main ending when ctx does (besides SIGINT and SIGTERM), for running the
// webhook inside another process (the sandbox).
func MainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "dynamig-webhook",
		Short: "Mutating admission webhook: GPU pods that name no scheduler get schedulerName " + api.DefaultSchedulerName,
		Long: `Serves dynamig's mutating admission webhook over TLS. A pod created with the GPU count resource
(nvidia.com/gpu, or the device config's resourceCountName) in any container's limits or requests,
init containers included, whose schedulerName is empty or one of --replace-scheduler-names, gets
schedulerName ` + api.DefaultSchedulerName + `; nothing else is patched. Every replica serves. The serving
certificate and its CA live in the Secret --cert-secret (mounted at --cert-dir); the webhook creates
and rotates them and injects the CA into the MutatingWebhookConfiguration --webhook-configuration.`,
		Example: `  dynamig-webhook --config /etc/dynamig/device-config.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.NoArgs(cmd, args); err != nil {
				return usageError{err}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if version.Requested(cmd) {
				fmt.Fprintln(cmd.OutOrStdout(), version.Get().String("dynamig-webhook"))
				return nil
			}
			return o.Run(cmd.Context())
		},
	}
	version.AddFlag(cmd)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	namespace := os.Getenv("POD_NAMESPACE")
	if namespace == "" {
		namespace = api.DefaultSystemNamespace
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; default: the in-cluster configuration")
	f.StringVar(&o.DeviceConfig, "config", "", "device-config.yaml, for nvidia.resourceCountName; default: HAMi v2.10's defaults (nvidia.com/gpu)")
	f.StringVar(&o.SchedulerName, "scheduler-name", api.DefaultSchedulerName, "the schedulerName GPU pods get")
	f.StringSliceVar(&o.Replace, "replace-scheduler-names", []string{v1.DefaultSchedulerName}, "scheduler names that count as naming none (an empty schedulerName always does)")
	f.StringVar(&o.Namespace, "namespace", namespace, "namespace of the certificate Secret and the Service (default: $POD_NAMESPACE, else "+api.DefaultSystemNamespace+")")
	f.StringVar(&o.CertSecret, "cert-secret", DefaultCertSecret, "Secret holding the CA and the serving certificate")
	f.StringVar(&o.Configuration, "webhook-configuration", DefaultWebhookConfiguration, "MutatingWebhookConfiguration whose caBundle the webhook keeps")
	f.StringVar(&o.DNSName, "dns-name", "", "the serving certificate's DNS name (default: "+DefaultService+".<namespace>.svc)")
	f.StringSliceVar(&o.ExtraDNSNames, "extra-dns-names", nil, "further DNS names of the serving certificate")
	f.StringVar(&o.CertDir, "cert-dir", "/certs", "where the certificate Secret is mounted (tls.crt, tls.key)")
	f.StringVar(&o.BindAddress, "bind-address", ":9443", "host:port the webhook serves HTTPS on")
	f.StringVar(&o.HealthAddress, "health-probe-bind-address", ":8081", "where /healthz and /readyz are served (\"0\": nowhere)")
	f.StringVar(&o.MetricsAddress, "metrics-bind-address", ":9396", "where controller-runtime's /metrics (webhook request counts and latencies) are served (\"0\": nowhere)")
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	if errors.As(err, new(usageError)) {
		fmt.Fprintf(stderr, "Run 'dynamig-webhook --help' for usage.\n")
		return exitUsage
	}
	return exitError
}

// Run serves the webhook until ctx ends or SIGINT/SIGTERM.
func (o *Options) Run(ctx context.Context) error {
	dev, err := config.LoadDeviceConfig(o.DeviceConfig)
	if err != nil {
		return usageError{err}
	}
	if o.SchedulerName == "" {
		return usageError{errors.New("--scheduler-name must not be empty")}
	}
	host, portText, err := net.SplitHostPort(o.BindAddress)
	if err != nil {
		return usageError{fmt.Errorf("--bind-address %q: %w", o.BindAddress, err)}
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return usageError{fmt.Errorf("--bind-address %q: the port must be a number", o.BindAddress)}
	}
	restConfig, err := o.restConfig()
	if err != nil {
		return usageError{err}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.FromContext(ctx)
	ctrl.SetLogger(logger)

	server := webhook.NewServer(webhook.Options{Host: host, Port: port, CertDir: o.CertDir})
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		WebhookServer:          server,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddress},
		HealthProbeBindAddress: o.HealthAddress,
		BaseContext:            func() context.Context { return ctx },
	})
	if err != nil {
		return err
	}
	// Every replica rotates and serves: the Secret's resourceVersion settles a race
	// between replicas, and a webhook behind a leader would be down during fail-over.
	certsReady := make(chan struct{})
	dnsName := o.DNSName
	if dnsName == "" {
		dnsName = DefaultService + "." + o.Namespace + ".svc"
	}
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: o.Namespace, Name: o.CertSecret},
		CertDir:        o.CertDir,
		CAName:         "dynamig-webhook-ca",
		CAOrganization: "dynamig",
		DNSName:        dnsName,
		ExtraDNSNames:  o.ExtraDNSNames,
		IsReady:        certsReady,
		Webhooks:       []rotator.WebhookInfo{{Name: o.Configuration, Type: rotator.Mutating}},
		ControllerName: rotatorName(),
	}); err != nil {
		return fmt.Errorf("certificate rotation: %w", err)
	}
	// The webhook server reads its certificate at start, so it joins the manager once the
	// certificate is in --cert-dir and the CA is in the webhook configuration.
	serving := make(chan struct{})
	go func() {
		select {
		case <-certsReady:
		case <-ctx.Done():
			return
		}
		mgr.GetWebhookServer().Register(dynamigwebhook.Path, &webhook.Admission{Handler: &dynamigwebhook.SchedulerNameSetter{SchedulerNameSetter: mutation.SchedulerNameSetter{
			Resource: v1.ResourceName(dev.Nvidia.ResourceCountName), SchedulerName: o.SchedulerName, Replace: o.Replace,
			Shares: []v1.ResourceName{v1.ResourceName(dev.Nvidia.ResourceMemoryName), v1.ResourceName(dev.Nvidia.ResourceMemoryPercentageName),
				v1.ResourceName(dev.Nvidia.ResourceCoreName)},
			DefaultGPUNum: dev.Nvidia.DefaultGPUNum,
		}}})
		close(serving)
		logger.Info("Serving the webhook", "address", o.BindAddress, "path", dynamigwebhook.Path, "resource", dev.Nvidia.ResourceCountName, "schedulerName", o.SchedulerName, "defaultGPUNum", dev.Nvidia.DefaultGPUNum)
	}()
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", func(req *http.Request) error {
		select {
		case <-serving:
			return server.StartedChecker()(req)
		default:
			return errors.New("waiting for the serving certificate")
		}
	}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// runs counts the webhooks this process has started.
var runs atomic.Int32

// rotatorName names the certificate rotator's controller. controller-runtime refuses a
// controller name a process has used before, even once its manager stopped, so a process
// that runs the webhook again (the sandbox, its tests) numbers the later ones.
func rotatorName() string {
	if n := runs.Add(1); n > 1 {
		return "dynamig-webhook-cert-rotator-" + strconv.Itoa(int(n))
	}
	return "dynamig-webhook-cert-rotator"
}

func (o *Options) restConfig() (*rest.Config, error) {
	if o.Kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	}
	return rest.InClusterConfig()
}
