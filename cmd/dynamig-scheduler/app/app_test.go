package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"

	kubeapp "k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig"
)

// shippedConfig is the KubeSchedulerConfiguration the binary is run with (the chart's
// ConfigMap, rendered by `make manifests`).
var shippedConfig = filepath.Join("..", "..", "..", "manifests", "scheduler-config.yaml")

// mountedDeviceConfig is where the chart mounts the device ConfigMap in the scheduler's pod.
const mountedDeviceConfig = "/etc/dynamig/device-config.yaml"

const profileName = "dynamig-scheduler"

// TestShippedSchedulerConfig loads manifests/scheduler-config.yaml through kube-scheduler's
// own option parsing and app.Setup with the binary's plugin registry, as
// `dynamig-scheduler --config manifests/scheduler-config.yaml` does, and checks the
// resulting profile. Setup builds every framework, so DynamicMIG's New runs on the
// file's args. Nothing contacts an API server: --master names an unused address, and
// leader election and secure serving are off.
func TestShippedSchedulerConfig(t *testing.T) {
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	defer cancel()

	// The file names the device ConfigMap where the chart mounts it; here it is an empty
	// device config (HAMi's defaults) in the test's directory.
	raw, err := os.ReadFile(shippedConfig)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	deviceConfig := filepath.Join(dir, "device-config.yaml")
	if err := os.WriteFile(deviceConfig, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte("deviceConfigFile: "+mountedDeviceConfig+"\n")) {
		t.Fatalf("%s: DynamicMIG's deviceConfigFile is not %s, where the chart mounts the device ConfigMap", shippedConfig, mountedDeviceConfig)
	}
	configFile := filepath.Join(dir, "scheduler-config.yaml")
	if err := os.WriteFile(configFile, bytes.Replace(raw, []byte(mountedDeviceConfig), []byte(deviceConfig), 1), 0o600); err != nil {
		t.Fatal(err)
	}

	opts := options.NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{
		"--config", configFile,
		"--leader-elect=false",
		"--master", "https://127.0.0.1:1",
		"--secure-port", "0",
	}); err != nil {
		t.Fatal(err)
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		t.Fatal(err)
	}
	cc, sched, err := kubeapp.Setup(ctx, opts, RegistryOptions()...)
	if err != nil {
		t.Fatalf("Setup with %s: %v", shippedConfig, err)
	}

	// Client connection: 200/400, in the config and in the client built from it.
	if cc.ComponentConfig.ClientConnection.QPS != 200 || cc.ComponentConfig.ClientConnection.Burst != 400 {
		t.Errorf("clientConnection qps/burst = %v/%v, want 200/400", cc.ComponentConfig.ClientConnection.QPS, cc.ComponentConfig.ClientConnection.Burst)
	}
	if cc.KubeConfig.QPS != 200 || cc.KubeConfig.Burst != 400 {
		t.Errorf("client QPS/Burst = %v/%v, want 200/400", cc.KubeConfig.QPS, cc.KubeConfig.Burst)
	}

	// The framework as built: extension points in order.
	if got := len(sched.Profiles); got != 1 {
		t.Errorf("%d profiles, want 1 (%s)", got, profileName)
	}
	fw, ok := sched.Profiles[profileName]
	if !ok {
		t.Fatalf("no profile %q; profiles: %v", profileName, keys(sched.Profiles))
	}
	plugins := fw.ListPlugins()
	if got, want := names(plugins.Bind), []string{dynamicmig.Name, "DefaultBinder"}; !slices.Equal(got, want) {
		t.Errorf("Bind plugins = %v, want exactly %v (DynamicMIG first: DefaultBinder binds every pod it sees)", got, want)
	}
	for point, set := range map[string]schedconfig.PluginSet{
		"PreFilter": plugins.PreFilter,
		"Filter":    plugins.Filter,
		"Score":     plugins.Score,
		"Reserve":   plugins.Reserve,
	} {
		if !slices.Contains(names(set), dynamicmig.Name) {
			t.Errorf("DynamicMIG is not enabled at %s: %v", point, names(set))
		}
	}
	// The defaults stay enabled next to DynamicMIG.
	for _, name := range []string{"NodeResourcesFit", "TaintToleration", "NodeAffinity"} {
		if !slices.Contains(names(plugins.Filter), name) {
			t.Errorf("default plugin %s is not enabled at Filter: %v", name, names(plugins.Filter))
		}
	}
	// DynamicMIG ranks CPU and memory by the node policy: NodeResourcesFit's LeastAllocated
	// score, which would spread them whatever the policy, is off; the balance score stays.
	if score := names(plugins.Score); slices.Contains(score, "NodeResourcesFit") || !slices.Contains(score, "NodeResourcesBalancedAllocation") {
		t.Errorf("Score plugins = %v: want NodeResourcesFit off, NodeResourcesBalancedAllocation on", score)
	}
	// Its PreScore prepares only its Score: off with it.
	if preScore := names(plugins.PreScore); slices.Contains(preScore, "NodeResourcesFit") || !slices.Contains(preScore, "NodeResourcesBalancedAllocation") {
		t.Errorf("PreScore plugins = %v: want NodeResourcesFit off, NodeResourcesBalancedAllocation on", preScore)
	}

	var prof *schedconfig.KubeSchedulerProfile
	for i := range cc.ComponentConfig.Profiles {
		if cc.ComponentConfig.Profiles[i].SchedulerName == profileName {
			prof = &cc.ComponentConfig.Profiles[i]
		}
	}
	if prof == nil {
		t.Fatalf("no profile %q in the component config", profileName)
	}

	// NodeResourcesFit ignores the request-only resources; the rest at the defaults.
	fit, ok := pluginArgs(t, prof, "NodeResourcesFit").(*schedconfig.NodeResourcesFitArgs)
	if !ok {
		t.Fatalf("NodeResourcesFit args are %T", pluginArgs(t, prof, "NodeResourcesFit"))
	}
	wantIgnored := []string{"nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority"}
	if !slices.Equal(fit.IgnoredResources, wantIgnored) {
		t.Errorf("NodeResourcesFit ignoredResources = %v, want %v", fit.IgnoredResources, wantIgnored)
	}
	wantStrategy := &schedconfig.ScoringStrategy{
		Type:      schedconfig.LeastAllocated,
		Resources: []schedconfig.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}},
	}
	if len(fit.IgnoredResourceGroups) != 0 || !reflect.DeepEqual(fit.ScoringStrategy, wantStrategy) {
		t.Errorf("NodeResourcesFit args beyond ignoredResources are not the defaults: groups %v, strategy %+v", fit.IgnoredResourceGroups, fit.ScoringStrategy)
	}

	// DynamicMIG: the file names every field, each at its default.
	rawArgs, ok := pluginArgs(t, prof, dynamicmig.Name).(*runtime.Unknown)
	if !ok {
		t.Fatalf("DynamicMIG args are %T, want the raw args", pluginArgs(t, prof, dynamicmig.Name))
	}
	args, err := config.DecodeDynamicMIGArgs(rawArgs.Raw)
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := config.DecodeDynamicMIGArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	defaults.DeviceConfigFile = deviceConfig // the mounted ConfigMap, as rewritten above
	if !reflect.DeepEqual(args, defaults) {
		t.Errorf("DynamicMIG args are not the defaults:\n got %+v\nwant %+v", args, defaults)
	}
	var given map[string]any
	if err := json.Unmarshal(rawArgs.Raw, &given); err != nil {
		t.Fatal(err)
	}
	for _, key := range jsonFields(reflect.TypeFor[config.DynamicMIGArgs]()) {
		if _, ok := given[key]; !ok {
			t.Errorf("DynamicMIG args in %s do not list %q (the file lists every field at its default)", shippedConfig, key)
		}
	}
}

// TestShippedConfigLeaderElection: the file itself elects a leader (the test above turns it
// off by flag, as the sandbox does).
func TestShippedConfigLeaderElection(t *testing.T) {
	cfg, err := options.LoadConfigFromFile(klog.Background(), shippedConfig)
	if err != nil {
		t.Fatal(err)
	}
	le := cfg.LeaderElection
	if !le.LeaderElect {
		t.Errorf("leaderElection.leaderElect is false in %s", shippedConfig)
	}
	// Its own Lease, not the default kube-scheduler's.
	if le.ResourceNamespace != "dynamig-system" || le.ResourceName != "dynamig-scheduler" {
		t.Errorf("leader election Lease %s/%s, want dynamig-system/dynamig-scheduler", le.ResourceNamespace, le.ResourceName)
	}
}

func TestCommandFlags(t *testing.T) {
	var out bytes.Buffer
	cmd := NewCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	// Unstamped (a test binary records no module versions either: `make build` stamps and
	// the version package's tests cover the rest).
	if got := out.String(); !strings.HasPrefix(got, "dynamig-scheduler dev (commit ") {
		t.Errorf("--version printed %q", got)
	}

	out.Reset()
	cmd = NewCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dynamig-scheduler [flags]", "--config", "--dynamig-metrics-bind-address", `(default ":9395")`, "--version"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not mention %q", want)
		}
	}
}

func names(set schedconfig.PluginSet) []string {
	var out []string
	for _, p := range set.Enabled {
		out = append(out, p.Name)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func pluginArgs(t *testing.T, prof *schedconfig.KubeSchedulerProfile, name string) runtime.Object {
	t.Helper()
	for _, pc := range prof.PluginConfig {
		if pc.Name == name {
			return pc.Args
		}
	}
	t.Fatalf("profile %s has no pluginConfig for %s", prof.SchedulerName, name)
	return nil
}

// jsonFields are the JSON names of t's fields, inlined structs expanded, TypeMeta left out.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && f.Name == "TypeMeta":
		case strings.Contains(opts, "inline") || (f.Anonymous && name == ""):
			out = append(out, jsonFields(f.Type)...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}
