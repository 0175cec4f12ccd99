package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dynamig/dynamig/api"
	webhookapp "github.com/dynamig/dynamig/cmd/dynamig-webhook/app"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/kubeletnode"
	dynamigwebhook "github.com/dynamig/dynamig/webhook"
)

// DefaultWebhookManifest is the shipped webhook manifest, relative to the repository root.
const DefaultWebhookManifest = "manifests/webhook.yaml"

// startWebhook runs `dynamig-webhook` in-process as cluster.UserWebhook behind the shipped
// MutatingWebhookConfiguration and certificate Secret. The sandbox has no Service routing,
// so the configuration calls the webhook by URL (https://localhost:<port>, a name of the
// certificate), and a stand-in for kubelet's Secret volume writes the Secret into the
// webhook's --cert-dir. It returns once the API server, over TLS, has had a dry-run GPU pod
// mutated.
func (s *Sandbox) startWebhook(ctx context.Context, manifest string) error {
	raw, err := os.ReadFile(manifest)
	if err != nil {
		return err
	}
	objs, err := cluster.DecodeManifest(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", manifest, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var secret *v1.Secret
	var configuration *admissionregistrationv1.MutatingWebhookConfiguration
	for _, obj := range objs {
		switch o := obj.(type) {
		case *v1.Secret:
			secret = o
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			configuration = o
		}
	}
	if secret == nil || configuration == nil {
		return fmt.Errorf("%s: want a Secret and a MutatingWebhookConfiguration", manifest)
	}
	url := "https://localhost:" + strconv.Itoa(port) + dynamigwebhook.Path
	for i := range configuration.Webhooks {
		configuration.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
	}
	if _, err := s.admin.CoreV1().Secrets(secret.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := s.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, configuration, metav1.CreateOptions{}); err != nil {
		return err
	}

	certDir := filepath.Join(s.dir, "webhook-certs")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return err
	}
	s.projectSecret(secret.Namespace, secret.Name, certDir)
	kubeconfig, err := s.cp.WriteKubeconfig(cluster.UserWebhook)
	if err != nil {
		return err
	}
	args := []string{"--kubeconfig", kubeconfig, "--config", s.deviceConfig, "--namespace", secret.Namespace,
		"--cert-secret", secret.Name, "--webhook-configuration", configuration.Name, "--extra-dns-names", "localhost",
		"--cert-dir", certDir, "--bind-address", "127.0.0.1:" + strconv.Itoa(port),
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
	if err := waitWebhookServes(ctx, s.admin, s.webhookDone); err != nil {
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
// admits it with schedulerName dynamig-scheduler, or the webhook has exited.
func waitWebhookServes(ctx context.Context, client kubernetes.Interface, exited <-chan struct{}) error {
	var last error
	err := cluster.AwaitAdmission(ctx, client, "webhook-probe", time.Minute, func(pod *v1.Pod, err error) (bool, error) {
		select {
		case <-exited:
			return false, errors.New("dynamig-webhook exited")
		default:
		}
		last = err
		return err == nil && pod.Spec.SchedulerName == api.DefaultSchedulerName, nil
	})
	if err != nil {
		return fmt.Errorf("the webhook does not mutate GPU pods: %w (last answer: %v)", err, last)
	}
	return nil
}
