package config

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// DynamicMIGArgsOf reads the DynamicMIG args out of a KubeSchedulerConfiguration (the
// chart's ConfigMap dynamig-scheduler-config): those of the profile named schedulerName, or
// of the only profile that configures DynamicMIG when schedulerName is "". A profile
// without DynamicMIG args gets the defaults. The args are decoded strictly, defaulted and
// validated, as the scheduler does.
func DynamicMIGArgsOf(kubeSchedulerConfig []byte, schedulerName string) (*DynamicMIGArgs, error) {
	written, profile, err := DynamicMIGArgsAsWritten(kubeSchedulerConfig, schedulerName)
	if err != nil {
		return nil, err
	}
	raw := []byte("{}")
	if written != nil {
		if raw, err = yaml.Marshal(written); err != nil {
			return nil, err
		}
	}
	args, err := DecodeDynamicMIGArgs(raw)
	if err != nil {
		return nil, fmt.Errorf("KubeSchedulerConfiguration, profile %s: %w", profile, err)
	}
	return args, nil
}

// DynamicMIGArgsAsWritten finds the profile as DynamicMIGArgsOf does and returns its
// DynamicMIG args as written, undecoded and without defaults (nil when it has none), and
// the profile's schedulerName ("" when no profile configures DynamicMIG and none was named).
func DynamicMIGArgsAsWritten(kubeSchedulerConfig []byte, schedulerName string) (map[string]any, string, error) {
	var cfg struct {
		Profiles []struct {
			SchedulerName string `json:"schedulerName"`
			PluginConfig  []struct {
				Name string         `json:"name"`
				Args map[string]any `json:"args"`
			} `json:"pluginConfig"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal(kubeSchedulerConfig, &cfg); err != nil {
		return nil, "", fmt.Errorf("KubeSchedulerConfiguration: %w", err)
	}
	var found []map[string]any
	var names []string
	for _, p := range cfg.Profiles {
		if schedulerName != "" && p.SchedulerName != schedulerName {
			continue
		}
		var args map[string]any
		for _, pc := range p.PluginConfig {
			if pc.Name == "DynamicMIG" {
				args = pc.Args
			}
		}
		if args != nil || schedulerName != "" {
			found, names = append(found, args), append(names, p.SchedulerName)
		}
	}
	switch {
	case len(found) == 0 && schedulerName != "":
		return nil, "", fmt.Errorf("KubeSchedulerConfiguration: no profile has schedulerName %q", schedulerName)
	case len(found) == 0:
		return nil, "", nil
	case len(found) > 1:
		return nil, "", fmt.Errorf("KubeSchedulerConfiguration: profiles %v all configure DynamicMIG: name one", names)
	}
	return found[0], names[0], nil
}
