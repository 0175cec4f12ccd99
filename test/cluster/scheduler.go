package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	"k8s.io/component-base/configz"
	"k8s.io/klog/v2"
	kubeapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedulerserverconfig "k8s.io/kubernetes/cmd/kube-scheduler/app/config"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler"

	schedapp "github.com/dynamig/dynamig/cmd/dynamig-scheduler/app"
)

// schedulerSeq numbers the scheduler configs written into a control plane's directory.
var schedulerSeq atomic.Int64

// SchedulerConfig copies the KubeSchedulerConfiguration at src (typically
// manifests/scheduler-config.yaml) into the control plane's directory with
// clientConnection.kubeconfig set to a kubeconfig of UserScheduler, leader election off and
// DynamicMIG's deviceConfigFile cleared (the file names where the chart mounts the device
// ConfigMap; an edit such as DeviceConfigFile sets another), and returns the copy's path.
// The edits change the parsed document; everything else is kept as written.
func (cp *ControlPlane) SchedulerConfig(src string, edits ...func(doc map[string]any) error) (string, error) {
	kubeconfig, err := cp.WriteKubeconfig(UserScheduler)
	if err != nil {
		return "", err
	}
	return cp.SchedulerConfigAs(src, kubeconfig, edits...)
}

// SchedulerConfigAs is SchedulerConfig with the scheduler authenticating through kubeconfig.
func (cp *ControlPlane) SchedulerConfigAs(src, kubeconfig string, edits ...func(doc map[string]any) error) (string, error) {
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	for _, edit := range append([]func(map[string]any) error{DeviceConfigFile("")}, edits...) {
		if err := edit(doc); err != nil {
			return "", fmt.Errorf("%s: %w", src, err)
		}
	}
	section := func(name string) map[string]any {
		m, ok := doc[name].(map[string]any)
		if !ok {
			m = map[string]any{}
			doc[name] = m
		}
		return m
	}
	section("clientConnection")["kubeconfig"] = kubeconfig
	section("leaderElection")["leaderElect"] = false
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	p := filepath.Join(cp.Dir, fmt.Sprintf("scheduler-config-%d.yaml", schedulerSeq.Add(1)))
	return p, os.WriteFile(p, out, 0o600)
}

// DeviceConfigFile is a SchedulerConfig edit that sets DynamicMIG's deviceConfigFile in every
// profile's pluginConfig ("" is HAMi v2.10's defaults).
func DeviceConfigFile(path string) func(doc map[string]any) error {
	return func(doc map[string]any) error {
		profiles, _ := doc["profiles"].([]any)
		found := false
		for _, p := range profiles {
			pm, _ := p.(map[string]any)
			pcs, _ := pm["pluginConfig"].([]any)
			for _, pc := range pcs {
				m, _ := pc.(map[string]any)
				if m == nil || m["name"] != "DynamicMIG" {
					continue
				}
				args, _ := m["args"].(map[string]any)
				if args == nil {
					args = map[string]any{}
					m["args"] = args
				}
				args["deviceConfigFile"] = path
				found = true
			}
		}
		if !found && path != "" {
			return errors.New("no profile has a DynamicMIG pluginConfig entry")
		}
		return nil
	}
}

// StartScheduler runs the real dynamig-scheduler in-process: kube-scheduler's app.Setup
// with the registry options of cmd/dynamig-scheduler (RegistryOptions), then app.Run in a
// goroutine. configFile is a KubeSchedulerConfiguration whose clientConnection names the
// kubeconfig to use (see SchedulerConfig); kube-scheduler's own flags stay at their
// defaults, except that its secure serving (healthz, metrics) is off. The DynamicMIG
// metrics listener belongs to the command, not to the registry options, so none is opened.
//
// flags are kube-scheduler command-line flags the binary would get beside --config, such as
// the chart's --feature-gates; feature gates are the process's, so they also hold for the
// control plane's API server in this process.
//
// stop cancels the scheduler and waits until app.Run has returned. Only one scheduler may
// run in a process at a time (app.Run registers the process-wide configz entry).
func StartScheduler(ctx context.Context, cp *ControlPlane, configFile string, flags ...string) (stop func(), err error) {
	return runScheduler(ctx, cp, configFile, flags, func(ctx context.Context, cc *schedulerserverconfig.CompletedConfig, sched *scheduler.Scheduler) {
		// Run returns only when ctx ends (with "finished without leader elect") or on a
		// start error.
		if err := kubeapp.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "dynamig-scheduler stopped")
		}
	}, func() { configz.Delete("componentconfig") })
}

// StartSchedulerBeside runs another scheduler in-process beside the one StartScheduler runs
// (e.g. a cluster's default scheduler, configured with kube-scheduler's default profile): app.Setup
// as StartScheduler does, then what app.Run does but for its process-wide parts (the configz
// entry, health and metrics serving, leader election): the event sink, the informers, and the
// scheduling loop once its caches and event handlers are synced. stop cancels it and waits.
func StartSchedulerBeside(ctx context.Context, cp *ControlPlane, configFile string) (stop func(), err error) {
	return runScheduler(ctx, cp, configFile, nil, func(ctx context.Context, cc *schedulerserverconfig.CompletedConfig, sched *scheduler.Scheduler) {
		cc.EventBroadcaster.StartRecordingToSink(ctx.Done())
		defer cc.EventBroadcaster.Shutdown()
		cc.InformerFactory.Start(ctx.Done())
		if cc.DynInformerFactory != nil {
			cc.DynInformerFactory.Start(ctx.Done())
		}
		cc.InformerFactory.WaitForCacheSync(ctx.Done())
		if cc.DynInformerFactory != nil {
			cc.DynInformerFactory.WaitForCacheSync(ctx.Done())
		}
		if err := sched.WaitForHandlersSync(ctx); err != nil {
			if ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "a scheduler's event handlers did not sync")
			}
			return
		}
		sched.Run(ctx)
	}, nil)
}

// runScheduler sets a scheduler up from configFile (kube-scheduler's app.Setup with dynamig's
// registry options, its own flags at their defaults but for flags and secure serving: no
// listener) and runs it with run in a goroutine; stop cancels it, waits until run has
// returned, then calls stopped (if any).
func runScheduler(ctx context.Context, cp *ControlPlane, configFile string, flags []string,
	run func(context.Context, *schedulerserverconfig.CompletedConfig, *scheduler.Scheduler), stopped func()) (stop func(), err error) {
	if cp == nil {
		return nil, errors.New("no control plane")
	}
	opts := options.NewOptions()
	if len(flags) > 0 {
		// As the command parses them: every named flag set in one.
		fs := pflag.NewFlagSet("dynamig-scheduler", pflag.ContinueOnError)
		for _, name := range opts.Flags.Order {
			fs.AddFlagSet(opts.Flags.FlagSet(name))
		}
		if err := fs.Parse(flags); err != nil {
			return nil, fmt.Errorf("scheduler flags %q: %w", flags, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	opts.ConfigFile = configFile
	opts.SecureServing.BindPort = 0
	cc, sched, err := kubeapp.Setup(ctx, opts, schedapp.RegistryOptions()...)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("setting up a scheduler from %s: %w", configFile, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, cc, sched)
	}()
	var once atomic.Bool
	return func() {
		if once.Swap(true) {
			return
		}
		cancel()
		<-done
		if stopped != nil {
			stopped()
		}
	}, nil
}
