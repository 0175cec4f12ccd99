// Package controllermanager runs the real kube-controller-manager in-process against a control
// plane of package cluster: its default controllers — Deployments, ReplicaSets, Jobs,
// DaemonSets, StatefulSets, the garbage collector, node lifecycle, service accounts, the
// root CA publisher, namespaces — so that workloads make their pods as on a real
// cluster. It is a package of its own so that only the suites that run it link it: its build
// is about 20 MB of Kubernetes source beyond the API server's and the kubelet's, and every
// Kubernetes minor's suite builds package cluster.
package controllermanager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/compatibility"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app/options"

	"github.com/dynamig/dynamig/test/cluster"
)

// Start runs kube-controller-manager's default controllers against cp as
// cluster.UserControllerManager, each controller as its own service account in kube-system
// (--use-service-account-credentials, their tokens from the TokenRequest API), as kubeadm runs
// it, but for the legacy token controller, which fills Secrets of type
// kubernetes.io/service-account-token: it signs with the API server's service-account key, and
// the test API server keeps its key to itself (a file it removes once started). Pods get their
// tokens from the TokenRequest API, as on every cluster since 1.24. It returns once the service-account controller has made the default namespace's
// ServiceAccount, the sign that the controllers run; ctx bounds that wait only. stop ends it and
// waits for it.
func Start(ctx context.Context, cp *cluster.ControlPlane) (stop func(), err error) {
	kubeconfig, err := cp.WriteKubeconfig(cluster.UserControllerManager)
	if err != nil {
		return nil, err
	}
	flags := []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--root-ca-file=" + cp.CAFile(),
		// Nothing served: tests read what the controllers do from the API server.
		"--secure-port=0",
	}

	s, err := options.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	// Its own registry of component versions and feature gates (a copy of the process's), as
	// kube-controller-manager's test server does: the API server in this process registered
	// the default one, which can be set only once.
	gates := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	version := utilcompatibility.DefaultKubeEffectiveVersionForTest()
	version.SetEmulationVersion(gates.EmulationVersion())
	version.SetMinCompatibilityVersion(gates.MinCompatibilityVersion())
	registry := compatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(compatibility.DefaultKubeComponent, version, gates); err != nil {
		return nil, err
	}
	s.ComponentGlobalsRegistry = registry
	all, disabled, aliases := app.KnownControllers(), app.ControllersDisabledByDefault(), app.ControllerAliases()
	named := s.Flags(all, disabled, aliases)
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(flags); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	s.ParsedFlags = &named
	if err := registry.Set(); err != nil {
		return nil, err
	}
	c, err := s.Config(ctx, all, disabled, aliases)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}

	// ctx bounds the start only (the control plane's start passes its own, which ends with it).
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- app.Run(runCtx, c.Complete()) }()
	var once sync.Once
	var runErr error
	stop = func() {
		once.Do(func() {
			cancel()
			runErr = <-done
			configz.Delete(app.ConfigzName)
		})
	}

	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		stop()
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			done <- err
			return false, fmt.Errorf("kube-controller-manager stopped: %v", err)
		default:
		}
		_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, ignoreNotFound(err)
	})
	if err != nil {
		stop()
		return nil, errors.Join(fmt.Errorf("waiting for kube-controller-manager's controllers: %w", err), runErr)
	}
	return stop, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
