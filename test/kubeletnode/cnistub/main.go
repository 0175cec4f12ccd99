// Command cnistub is the pod network of the test nodes on containerd: a CNI plugin that
// gives each pod an address and does nothing else. containerd reports the CRI's
// NetworkReady, without which the kubelet runs no pod, only once a CNI configuration loads;
// the test pods talk to nothing but themselves (the real loopback plugin, chained before
// this one, brings their lo up), so no bridge, route or rule is made, and nothing of the host
// changes. The address is 10.88.x.y, derived from the container ID.
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

func main() {
	if err := run(os.Getenv("CNI_COMMAND"), os.Getenv("CNI_CONTAINERID"), os.Stdin, os.Stdout); err != nil {
		// The CNI error form, on stdout.
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": "1.0.0", "code": 999, "msg": err.Error()})
		os.Exit(1)
	}
}

func run(command, containerID string, stdin io.Reader, stdout io.Writer) error {
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	switch command {
	case "VERSION":
		return json.NewEncoder(stdout).Encode(map[string]any{"cniVersion": "1.0.0", "supportedVersions": []string{"0.4.0", "1.0.0", "1.1.0"}})
	case "ADD":
		if err := json.NewDecoder(stdin).Decode(&conf); err != nil {
			return fmt.Errorf("network configuration: %w", err)
		}
		h := fnv.New32a()
		h.Write([]byte(containerID))
		v := h.Sum32()
		ip := fmt.Sprintf("10.88.%d.%d/16", v>>8&0xff, 1+v%254)
		return json.NewEncoder(stdout).Encode(map[string]any{"cniVersion": conf.CNIVersion,
			"interfaces": []map[string]any{{"name": "eth0", "sandbox": os.Getenv("CNI_NETNS")}},
			"ips":        []map[string]any{{"address": ip, "interface": 0}}})
	case "DEL", "CHECK", "GC", "STATUS":
		return nil
	default:
		return fmt.Errorf("unknown CNI_COMMAND %q", command)
	}
}
