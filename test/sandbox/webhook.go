package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	webhookapp "github.com/dynamig/dynamig/cmd/dynamig-webhook/app"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/kubeletnode"
)

// startWebhook runs `dynamig-webhook` in-process at addr, as the manifest's webhook service
// account (its pod on node), behind the manifest's MutatingWebhookConfiguration (which calls
// it by URL: https://localhost:<port>, a name of the certificate) and certificate Secret; a
// stand-in for kubelet's Secret volume writes the Secret into the webhook's --cert-dir. It
// returns once the API server, over TLS, has had a dry-run GPU pod mutated.
func (s *Sandbox) startWebhook(ctx context.Context, addr, node string) error {
	deployment, err := s.install.workload("Deployment", webhookName)
	if err != nil {
		return err
	}
	kubeconfig, err := s.identity(ctx, deployment, node, withoutProbes)
	if err != nil {
		return err
	}
	namespace := deployment.GetNamespace()
	certDir := filepath.Join(s.dir, "webhook-certs")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return err
	}
	s.projectSecret(namespace, webhookapp.DefaultCertSecret, certDir)
	args := []string{"--kubeconfig", kubeconfig, "--config", s.deviceConfig, "--namespace", namespace,
		"--scheduler-name", schedulerNameOf(deployment), "--extra-dns-names", "localhost",
		"--cert-dir", certDir, "--bind-address", addr,
		"--health-probe-bind-address", "0", "--metrics-bind-address", "0"}
	s.webhookDone = make(chan struct{})
	var out kubeletnode.LogBuffer
	go func() {
		defer close(s.webhookDone)
		code := webhookapp.MainContext(s.ctx, args, io.MultiWriter(&out, s.log), io.MultiWriter(&out, s.log))
		if s.ctx.Err() == nil {
			fmt.Fprintf(s.log, "dynamig-webhook exited %d\n", code)
		}
	}()
	if err := waitWebhookServes(ctx, s.admin, schedulerNameOf(deployment), s.webhookDone); err != nil {
		return fmt.Errorf("%w; dynamig-webhook said: %s", err, out.String())
	}
	return nil
}

// projectSecret does what kubelet's Secret volume does for the webhook's pod: it keeps the
// Secret's keys as files in dir, each replaced atomically.
func (s *Sandbox) projectSecret(namespace, name, dir string) {
	lw := cache.NewListWatchFromClient(s.admin.CoreV1().RESTClient(), "secrets", namespace, fields.OneTermEqualSelector("metadata.name", name))
	write := func(obj any) {
		secret, ok := obj.(*v1.Secret)
		if !ok {
			return
		}
		for key, value := range secret.Data {
			tmp := filepath.Join(dir, "."+key+".tmp")
			if err := os.WriteFile(tmp, value, 0o600); err != nil || os.Rename(tmp, filepath.Join(dir, key)) != nil {
				fmt.Fprintf(s.log, "webhook certificate volume: writing %s failed\n", key)
			}
		}
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: &v1.Secret{},
		Handler: cache.ResourceEventHandlerFuncs{AddFunc: write, UpdateFunc: func(_, obj any) { write(obj) }}})
	go informer.RunWithContext(s.ctx)
}

// waitWebhookServes polls a dry-run GPU pod that names no scheduler until the API server
// admits it with schedulerName, or the webhook has exited.
func waitWebhookServes(ctx context.Context, client kubernetes.Interface, schedulerName string, exited <-chan struct{}) error {
	var last error
	err := cluster.AwaitAdmission(ctx, client, "webhook-probe", time.Minute, nil, func(pod *v1.Pod, err error) (bool, error) {
		select {
		case <-exited:
			return false, errors.New("dynamig-webhook exited")
		default:
		}
		last = err
		return err == nil && pod.Spec.SchedulerName == schedulerName, nil
	})
	if err != nil {
		return fmt.Errorf("the webhook does not mutate GPU pods: %w (last answer: %v)", err, last)
	}
	return nil
}
