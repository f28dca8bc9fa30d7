package main

//lint:file-ignore SA1019 the Go CDK reads synthesis messages (errors, warnings, cdk-nag findings) only through cxapi.SynthesisMessage; its replacement is not published for Go.

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2/cxapi"
)

// computeTypes are the resource types the local variant leaves out.
var computeTypes = []string{
	"AWS::Lambda::Function",
	"AWS::Lambda::EventSourceMapping",
	"AWS::Lambda::Permission",
	"AWS::Lambda::EventInvokeConfig",
	"AWS::Events::Rule",
}

// TestLocalVariantTemplate compares the local variant with the full stack:
// exactly the compute is gone, everything else is there with the same
// properties, except where a property referred to a function (alarm
// dimensions and dashboard metrics name it instead, and the VPC access of
// the functions' roles and the writer's switch of its own event source
// mappings go with the functions).
func TestLocalVariantTemplate(t *testing.T) {
	full, local := synthesized(t), synthesizedLocal(t)
	fullRes := full.tmpl["Resources"].(map[string]any)
	localRes := local.tmpl["Resources"].(map[string]any)

	for _, typ := range computeTypes {
		if len(full.resources(typ)) == 0 {
			t.Errorf("the full stack has no %s", typ)
		}
		if n := len(local.resources(typ)); n != 0 {
			t.Errorf("the local variant has %d %s", n, typ)
		}
	}
	// Where the full stack refers to a function, the local variant names it.
	functionNames := map[string]string{}
	for id, r := range full.resources("AWS::Lambda::Function") {
		functionNames[id] = props(r)["FunctionName"].(string)
	}
	for id, r := range fullRes {
		typ := r.(map[string]any)["Type"].(string)
		if contains(computeTypes, typ) {
			continue
		}
		lr, ok := localRes[id]
		if !ok {
			t.Errorf("the local variant lacks %s (%s)", id, typ)
			continue
		}
		if reflect.DeepEqual(r, lr) {
			continue
		}
		switch typ {
		case "AWS::CloudWatch::Alarm":
			if f, l := namingFunctions(compact(r), functionNames), compact(lr); f != l {
				t.Errorf("alarm %s differs beyond naming its functions:\nfull  %s\nlocal %s", id, f, l)
			}
		case "AWS::CloudWatch::Dashboard":
			body := compact(props(lr.(map[string]any))["DashboardBody"])
			name := dashboardJob(props(lr.(map[string]any))["DashboardName"])
			for _, fn := range []string{fnPoller, fnWriter} {
				if !strings.Contains(body, `\"FunctionName\",\"`+name+"-"+fn+`\"`) {
					t.Errorf("dashboard %s of the local variant does not show function %s-%s", name, name, fn)
				}
			}
		case "AWS::CloudFormation::Stack":
			// A job's nested stack: its template differs (checked above,
			// resource by resource), and the bucket's name is a parameter
			// only where the functions get it.
			f, l := r.(map[string]any), lr.(map[string]any)
			if compact(f["DependsOn"]) != compact(l["DependsOn"]) {
				t.Errorf("nested stack %s depends on %s in the full stack, %s in the local variant", id, compact(f["DependsOn"]), compact(l["DependsOn"]))
			}
		case "AWS::IAM::Policy":
			checkVariantPolicy(t, id, r.(map[string]any), lr.(map[string]any))
		case "AWS::IAM::Role":
			// Only the cdk-nag suppression of the VPC statement goes.
			fp, lp := props(r.(map[string]any)), props(lr.(map[string]any))
			if !reflect.DeepEqual(fp, lp) {
				t.Errorf("role %s properties differ:\nfull  %s\nlocal %s", id, compact(fp), compact(lp))
			}
		default:
			t.Errorf("%s (%s) differs:\nfull  %s\nlocal %s", id, typ, compact(r), compact(lr))
		}
	}
	for id := range localRes {
		if _, ok := fullRes[id]; !ok {
			t.Errorf("the local variant has %s, which the full stack does not", id)
		}
	}
	for _, s := range []*synthesis{full, local} {
		out, _ := s.tmpl["Outputs"].(map[string]any)
		if _, ok := out["BucketName"]; !ok {
			t.Errorf("no BucketName output: %s", compact(out))
		}
	}
	for _, m := range local.messages {
		if m.level == string(cxapi.SynthesisMessageLevel_ERROR) {
			t.Errorf("local variant: %s: %s", m.path, firstLine(m.text))
		}
	}
	entries, err := os.ReadDir(local.outdir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "asset.") {
			t.Errorf("the local variant's assembly has an asset %s; it has no function code", e.Name())
		}
	}
}

// namingFunctions replaces, in the JSON text of a resource, each reference
// to a function by the function's name.
func namingFunctions(js string, names map[string]string) string {
	for id, name := range names {
		js = strings.ReplaceAll(js, compact(map[string]any{"Ref": id}), compact(name))
	}
	return js
}

// checkVariantPolicy: a function role's policy keeps every statement but the
// functions' VPC access, the writer's switch of its event source mappings
// and the poller's invocation of itself.
func checkVariantPolicy(t *testing.T, id string, full, local map[string]any) {
	t.Helper()
	stmts := func(r map[string]any) []string {
		var out []string
		for _, s := range props(r)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			switch s.(map[string]any)["Sid"] {
			case "VPCNetworkInterfaces", "FindOwnEventSourceMappings", "SwitchOwnEventSourceMappings", "StartStandbyAfterFailover":
				// Statements for the functions only: their VPC access, the
				// writer's switch of its own event source mappings and the
				// poller's invocation of itself.
				continue
			}
			out = append(out, compact(s))
		}
		sort.Strings(out)
		return out
	}
	if f, l := stmts(full), stmts(local); !reflect.DeepEqual(f, l) {
		t.Errorf("policy %s statements differ (the functions' own aside):\nfull  %v\nlocal %v", id, f, l)
	}
}
