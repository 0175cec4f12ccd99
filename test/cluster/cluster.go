// Package cluster runs an in-process control plane for tests and the sandbox: an embedded
// etcd, the real kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app/testing) with its
// default admission chain (ValidatingAdmissionPolicy included), and the real
// dynamig-scheduler (kube-scheduler's app.Setup and app.Run with dynamig's registry options).
//
// Every client identity is a static bearer token of its own user, so the API server's
// audit log (which the control plane always writes) says which component made each request:
// tests count a component's writes where they happen, at the server.
//
// All traffic stays on 127.0.0.1; every file lives under one temporary directory that Stop
// removes.
package cluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/freeport"
)

// The client identities the control plane knows. Each has its own static token; all are in
// system:masters unless Options.Users says otherwise. UserScheduler, UserDevicePlugin and
// UserWebhook are the service-account user names the components run as in a real cluster
// (manifests/rbac.yaml), the names manifests/admission-policies.yaml allows, so admission
// treats them here exactly as there.
const (
	UserAdmin        = "dynamig-admin"
	UserScheduler    = "system:serviceaccount:dynamig-system:dynamig-scheduler"
	UserDevicePlugin = "system:serviceaccount:dynamig-system:dynamig-device-plugin"
	UserWebhook      = "system:serviceaccount:dynamig-system:dynamig-webhook"
	// UserControllerManager is kube-controller-manager's user, outside system:masters: RBAC's
	// bootstrap policy grants it what it needs, as on a real control plane.
	UserControllerManager = "system:kube-controller-manager"
)

// Options configure the control plane. The zero value is a usable default.
type Options struct {
	// Dir is where the control plane's temporary directory is created; "" is os.TempDir().
	Dir string
	// Users maps extra user names to their groups, next to UserAdmin, UserScheduler,
	// UserDevicePlugin and UserWebhook (which are in system:masters).
	Users map[string][]string
	// APIServerFlags are appended to the API server's flags (they win over the defaults).
	APIServerFlags []string
	// Log receives the API server's test logger output and etcd's errors; nil discards it.
	Log io.Writer
	// Controllers, when set, starts kube-controller-manager's controllers once the API server
	// runs (package controllermanager's Start, which only the suites that need it link), and
	// the API server then admits as a real one does: ServiceAccount (pods get their service
	// account's token) and TaintNodesByCondition (a new node is not ready until node lifecycle
	// says so). Without it nothing makes the pods of a Deployment or Job, nothing lifts a
	// node's not-ready taint, and no ServiceAccount or token exists unless a test makes it.
	Controllers func(ctx context.Context, cp *ControlPlane) (stop func(), err error)
	// Empty leaves out dynamig's namespaces (made by default, as install.yaml's RBAC
	// needs them): a Helm install makes them, and refuses ones it did not make.
	Empty bool
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// Config is an admin (UserAdmin, system:masters) client config.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for UserAdmin.
	Kubeconfig string
	// Dir is the control plane's temporary directory, removed by Stop.
	Dir string
	// AuditLog is the API server's audit log: one JSON audit.k8s.io/v1 Event per line, at
	// stage ResponseComplete, for every write (create, update, patch, delete,
	// deletecollection) by UserScheduler and UserDevicePlugin (auditPolicy).
	AuditLog string
	// EtcdURL is the embedded etcd's client URL.
	EtcdURL string

	base            *rest.Config // the loopback config: host and TLS, no credentials
	caFile          string       // the API server's serving certificate, self-signed
	stopControllers func()
	tokens          map[string]string
	etcd            *embed.Etcd
	server          kubeapiservertesting.TestServer
	tb              *processTB // nil when a test's TB drives the server
	stopOnce        sync.Once
}

// Start starts a control plane for a test: tb gets the API server's logs and a cleanup that
// calls Stop (which may also be called earlier).
func Start(tb ktesting.TB, opts Options) (*ControlPlane, error) {
	tb.Helper()
	cp, err := start(context.Background(), tb, nil, opts)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(cp.Stop)
	return cp, nil
}

// StartProcess starts a control plane outside a test (TestMain, the sandbox). The caller
// must call Stop. ctx bounds the start only.
func StartProcess(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	ptb := newProcessTB(opts.Log)
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(tbFailure); !ok {
				panic(r)
			}
			err = fmt.Errorf("starting the control plane: %s", ptb.failure())
		}
		if err != nil {
			ptb.runCleanups()
		}
	}()
	return start(ctx, ptb, ptb, opts)
}

func start(ctx context.Context, tb ktesting.TB, ptb *processTB, opts Options) (_ *ControlPlane, err error) {
	dir, err := os.MkdirTemp(opts.Dir, "dynamig-cluster-")
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Dir: dir, tb: ptb, tokens: map[string]string{}}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}

	cp.etcd, cp.EtcdURL, err = startEtcd(dir)
	if err != nil {
		return nil, err
	}

	users := map[string][]string{
		UserAdmin:             {"system:masters"},
		UserScheduler:         {"system:masters"},
		UserDevicePlugin:      {"system:masters"},
		UserWebhook:           {"system:masters"},
		UserControllerManager: nil,
	}
	for u, g := range opts.Users {
		users[u] = g
	}
	tokenFile, err := cp.writeTokens(users)
	if err != nil {
		return nil, err
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	cp.AuditLog = filepath.Join(dir, "audit.log")
	// The serving certificate, made here: left to itself, the test server writes a generated
	// one into its package's testdata folder in the module cache, which only root may write
	// (a normal user's module cache is read-only), and the demo would need root.
	servingCert, servingKey, err := certutil.GenerateSelfSignedCertKey("127.0.0.1",
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")}, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	if err := os.WriteFile(certFile, servingCert, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyFile, servingKey, 0o600); err != nil {
		return nil, err
	}

	storage := storagebackend.NewDefaultConfig(path.Join("/", randomHex(8), "registry"), nil)
	storage.Transport.ServerList = []string{cp.EtcdURL}
	cp.caFile = certFile
	// Without kube-controller-manager nothing would make the ServiceAccounts the ServiceAccount
	// admission plugin requires, nor lift the not-ready taint TaintNodesByCondition puts on new
	// nodes.
	disabled := "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition"
	if opts.Controllers != nil {
		disabled = "--disable-admission-plugins="
	}
	flags := []string{
		// One API server, in-process: nothing maintains the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		disabled,
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
		// One API server has no peers to proxy to. From 1.36 the peer proxy is on (beta); the
		// test server then reads the serving certificate as the peers' CA from its own temp
		// folder (where ours is not) and the proxy keeps a certificate-reloading transport.
		"--feature-gates=UnknownVersionInteroperabilityProxy=false",
		"--authorization-mode=RBAC",
		// As kubeadm's and most clusters' API servers: the device plugin's DaemonSet is
		// privileged (MIG instance creation needs it).
		"--allow-privileged=true",
		"--token-auth-file=" + tokenFile,
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + cp.AuditLog,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--audit-log-maxbackup=0",
		// No rotation (0 would mean lumberjack's 100 MB): AuditEvents reads this one file,
		// and a benchmark's scenario writes more than 100 MB of it.
		"--audit-log-maxsize=1000000",
	}
	flags = append(flags, opts.APIServerFlags...)
	cp.server, err = kubeapiservertesting.StartTestServer(tb, kubeapiservertesting.NewDefaultTestServerOptions(), flags, storage)
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	cp.base = rest.AnonymousClientConfig(cp.server.ClientConfig)
	cp.base.QPS, cp.base.Burst = 1000, 10000
	cp.Config = cp.UserConfig(UserAdmin)
	if cp.Kubeconfig, err = cp.WriteKubeconfig(UserAdmin); err != nil {
		return nil, err
	}

	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// The namespaces of manifests/rbac.yaml: the system one, and the signing key's.
	for _, name := range []string{api.DefaultSystemNamespace, api.DefaultSigningKeyNamespace} {
		if opts.Empty {
			break
		}
		ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating namespace %s: %w", name, err)
		}
	}
	if opts.Controllers != nil {
		if cp.stopControllers, err = opts.Controllers(ctx, cp); err != nil {
			return nil, fmt.Errorf("starting kube-controller-manager: %w", err)
		}
	}
	return cp, nil
}

// CAFile is the API server's serving certificate (self-signed, so its own CA): what
// kube-controller-manager publishes to every namespace as kube-root-ca.crt.
func (cp *ControlPlane) CAFile() string { return cp.caFile }

// auditPolicy records the writes of dynamig's scheduler and device plugins, the writes tests
// count, at Metadata level (who, verb, object), and nothing else: the API server encodes the
// request object of every logged write to JSON even at Metadata level (apiserver's
// audit.LogRequestObject encodes before it looks at the level), which a benchmark's own
// pod creates would pay, a GPU pod's more than a CPU pod's.
var auditPolicy = fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted", "Panic"]
rules:
- level: Metadata
  users: [%q, %q]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`, UserScheduler, UserDevicePlugin)

// Stop shuts the API server and etcd down and removes the temporary directory. It is
// idempotent. Stop any scheduler started on the control plane first.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		if cp.stopControllers != nil {
			cp.stopControllers()
		}
		if cp.server.TearDownFn != nil {
			cp.server.TearDownFn()
		}
		if cp.etcd != nil {
			cp.etcd.Close()
			select {
			case <-cp.etcd.Server.StopNotify():
			case <-time.After(30 * time.Second):
			}
		}
		if cp.tb != nil {
			cp.tb.runCleanups()
		}
		_ = os.RemoveAll(cp.Dir)
	})
}

// UserConfig is a client config authenticating as user (one of the control plane's users).
func (cp *ControlPlane) UserConfig(user string) *rest.Config {
	c := rest.CopyConfig(cp.base)
	c.BearerToken = cp.tokens[user]
	c.UserAgent = user
	return c
}

// Client is a clientset for user.
func (cp *ControlPlane) Client(user string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cp.UserConfig(user))
}

// WriteKubeconfig writes a kubeconfig for user into the control plane's directory and
// returns its path.
func (cp *ControlPlane) WriteKubeconfig(user string) (string, error) {
	token, ok := cp.tokens[user]
	if !ok {
		return "", fmt.Errorf("unknown user %q", user)
	}
	return cp.WriteTokenKubeconfig(user, token)
}

// TokenConfig is a client config authenticating with a bearer token the API server issued
// (a service-account token); userAgent names the component in the server's logs.
func (cp *ControlPlane) TokenConfig(token, userAgent string) *rest.Config {
	c := rest.CopyConfig(cp.base)
	c.BearerToken = token
	c.UserAgent = userAgent
	return c
}

// WriteTokenKubeconfig writes a kubeconfig that authenticates with token into the control
// plane's directory, named after name, and returns its path.
func (cp *ControlPlane) WriteTokenKubeconfig(name, token string) (string, error) {
	user := name
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["dynamig"] = &clientcmdapi.Cluster{
		Server:                   cp.base.Host,
		CertificateAuthorityData: cp.base.CAData,
		TLSServerName:            cp.base.ServerName,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: "dynamig", AuthInfo: user}
	cfg.CurrentContext = user
	p := filepath.Join(cp.Dir, "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		return "", err
	}
	return p, nil
}

// SigningKeySetup reports whether an audit event is the scheduler's one-time setup of its
// signing key (the Secret, or its public key in the ConfigMap): writes counted per pod
// leave it out.
func SigningKeySetup(ev auditv1.Event) bool {
	r := ev.ObjectRef
	return r != nil && (r.Resource == "secrets" && r.Namespace == api.DefaultSigningKeyNamespace && (r.Name == api.SigningKeySecretName || ev.Verb == "create") ||
		r.Resource == "configmaps" && r.Namespace == api.DefaultSystemNamespace && (r.Name == api.PublicKeysConfigMapName || ev.Verb == "create"))
}

// AuditEvents reads the audit log: every completed write of the scheduler and the device
// plugins so far, in order.
func (cp *ControlPlane) AuditEvents() ([]auditv1.Event, error) {
	f, err := os.Open(cp.AuditLog)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []auditv1.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var ev auditv1.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			// The last line may be half written.
			continue
		}
		out = append(out, ev)
	}
	return out, sc.Err()
}

// Metrics returns the API server's /metrics, in Prometheus text format.
func (cp *ControlPlane) Metrics(ctx context.Context) (string, error) {
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return "", err
	}
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(raw), err
}

func (cp *ControlPlane) writeTokens(users map[string][]string) (string, error) {
	names := make([]string, 0, len(users))
	for u := range users {
		names = append(names, u)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, u := range names {
		token := randomHex(16)
		cp.tokens[u] = token
		// token,user,uid[,"group1,group2"]
		fmt.Fprintf(&b, "%s,%s,%d", token, u, 1000+i)
		if len(users[u]) > 0 {
			fmt.Fprintf(&b, ",%q", strings.Join(users[u], ","))
		}
		b.WriteString("\n")
	}
	p := filepath.Join(cp.Dir, "tokens.csv")
	return p, os.WriteFile(p, []byte(b.String()), 0o600)
}

// startEtcd starts a single-member etcd on free 127.0.0.1 ports, retrying when a port was
// taken between choosing and binding it.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := freeport.Ports(2)
		if err != nil {
			return nil, "", err
		}
		client := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
		peer := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}
		cfg := embed.NewConfig()
		cfg.Name = "dynamig"
		cfg.Dir = filepath.Join(dir, fmt.Sprintf("etcd-%d", attempt))
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		cfg.Logger = "zap"
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
		// Test data: fsync buys nothing and costs much on a shared disk.
		cfg.UnsafeNoFsync = true
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			lastErr = err
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			return e, client.String(), nil
		case err := <-e.Err():
			lastErr = err
		case <-time.After(time.Minute):
			lastErr = errors.New("etcd did not become ready within a minute")
		}
		e.Close()
	}
	return nil, "", fmt.Errorf("starting etcd: %w", lastErr)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
