// Command kubectl is upstream kubectl at the Kubernetes version dynamig pins, built from the
// module cache so that a fresh clone can drive the sandbox without installing anything.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
