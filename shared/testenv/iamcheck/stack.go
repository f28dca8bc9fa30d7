package iamcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"

	"github.com/changes-worker/changes-worker/shared/iampolicy"
)

// CloudFormation is the call FromStack makes.
type CloudFormation interface {
	cloudformation.ListStackResourcesAPIClient
}

// FromStack reads the policies of the stack name deployed from the cloud
// assembly in dir, in region and account: each function's role, with its
// policies (AWS::IAM::Policy resources attached to it and its inline
// policies), as the caller named by the function's name, and the stack's
// bucket, queue, topic and secret policies as resource-based policies.
// Every reference (Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select,
// Fn::Split, nested stack parameters, pseudo parameters) is resolved to
// the physical resources of the deployed stack and its nested stacks. A
// role with a managed policy is an error: its document is not in the
// template.
func FromStack(ctx context.Context, cfn CloudFormation, dir, name, region, account string) (*Policies, error) {
	root, err := readStack(ctx, cfn, dir, name+".template.json", name, name, nil, region, account)
	if err != nil {
		return nil, err
	}
	p := &Policies{Callers: map[string]*Principal{}}
	if err := root.collect(ctx, cfn, dir, p); err != nil {
		return nil, err
	}
	return p, nil
}

// scope is one deployed stack: its template, the physical ids of its
// resources, and its parameters' values.
type scope struct {
	name      string                    // the stack's name or id
	label     string                    // the stack's name, or a nested stack's logical id
	resources map[string]map[string]any // logical id → resource
	physical  map[string]string         // logical id → physical id
	params    map[string]any
	region    string
	account   string
}

func readStack(ctx context.Context, cfn CloudFormation, dir, file, stack, label string, params map[string]any, region, account string) (*scope, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return nil, fmt.Errorf("read template of %s: %w", stack, err)
	}
	var tmpl struct {
		Resources map[string]map[string]any
	}
	if err := json.Unmarshal(b, &tmpl); err != nil {
		return nil, fmt.Errorf("read template of %s: %w", stack, err)
	}
	s := &scope{name: stack, label: label, resources: tmpl.Resources, physical: map[string]string{}, params: params, region: region, account: account}
	pg := cloudformation.NewListStackResourcesPaginator(cfn, &cloudformation.ListStackResourcesInput{StackName: &stack})
	for pg.HasMorePages() {
		page, err := pg.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list resources of stack %s: %w", stack, err)
		}
		for _, r := range page.StackResourceSummaries {
			s.physical[aws.ToString(r.LogicalResourceId)] = aws.ToString(r.PhysicalResourceId)
		}
	}
	return s, nil
}

func props(r map[string]any) map[string]any {
	p, _ := r["Properties"].(map[string]any)
	return p
}

// collect adds the stack's functions, role policies and resource policies
// to p, then those of its nested stacks.
func (s *scope) collect(ctx context.Context, cfn CloudFormation, dir string, p *Policies) error {
	roles := map[string]*Principal{} // by the role's logical id
	role := func(id string) (*Principal, error) {
		if pr, ok := roles[id]; ok {
			return pr, nil
		}
		r, ok := s.resources[id]
		if !ok || r["Type"] != "AWS::IAM::Role" {
			return nil, fmt.Errorf("stack %s: %s is not a role of the stack", s.name, id)
		}
		arn, err := s.getAtt(id, "Arn")
		if err != nil {
			return nil, err
		}
		pr := &Principal{ARN: arn}
		if m, _ := props(r)["ManagedPolicyArns"].([]any); len(m) > 0 {
			return nil, fmt.Errorf("stack %s: role %s has managed policies %v, whose documents the check does not know", s.name, id, m)
		}
		inline, _ := props(r)["Policies"].([]any)
		for i, in := range inline {
			doc, _ := in.(map[string]any)["PolicyDocument"]
			pol, err := s.policy(fmt.Sprintf("%s/%s inline policy %d", s.label, id, i), doc)
			if err != nil {
				return nil, err
			}
			pr.Policies = append(pr.Policies, pol)
		}
		roles[id] = pr
		return pr, nil
	}
	functions := map[string]*Principal{} // by the function's logical id
	ids := make([]string, 0, len(s.resources))
	for id := range s.resources {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := s.resources[id]
		pp := props(r)
		switch r["Type"] {
		case "AWS::Lambda::Function":
			fn, err := s.str(pp["FunctionName"])
			if err != nil {
				return fmt.Errorf("stack %s: function %s: %w", s.name, id, err)
			}
			ref, ok := getAttOf(pp["Role"])
			if !ok {
				return fmt.Errorf("stack %s: function %s: its role is not a role of the stack: %v", s.name, id, pp["Role"])
			}
			pr, err := role(ref)
			if err != nil {
				return err
			}
			p.Callers[fn] = pr
			functions[id] = pr
		case "AWS::IAM::Policy":
			pol, err := s.policy(s.label+"/"+id, pp["PolicyDocument"])
			if err != nil {
				return err
			}
			attached, _ := pp["Roles"].([]any)
			for _, a := range attached {
				ref, ok := refOf(a)
				if !ok {
					return fmt.Errorf("stack %s: policy %s: role %v is not a role of the stack", s.name, id, a)
				}
				pr, err := role(ref)
				if err != nil {
					return err
				}
				pr.Policies = append(pr.Policies, pol)
			}
		case "AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy", "AWS::SNS::TopicPolicy":
			pol, err := s.policy(s.label+"/"+id, pp["PolicyDocument"])
			if err != nil {
				return err
			}
			p.Resource = append(p.Resource, pol)
		case "AWS::SecretsManager::ResourcePolicy":
			pol, err := s.policy(s.label+"/"+id, pp["ResourcePolicy"])
			if err != nil {
				return err
			}
			p.Resource = append(p.Resource, pol)
		case "AWS::IAM::ManagedPolicy":
			return fmt.Errorf("stack %s: managed policy %s: not supported by the check", s.name, id)
		}
	}
	for _, id := range ids {
		r := s.resources[id]
		if r["Type"] != "AWS::Lambda::EventSourceMapping" {
			continue
		}
		if ref, ok := refOf(props(r)["FunctionName"]); ok && functions[ref] != nil {
			functions[ref].EventSource = true
		}
	}
	for _, id := range ids {
		r := s.resources[id]
		if r["Type"] != "AWS::CloudFormation::Stack" {
			continue
		}
		md, _ := r["Metadata"].(map[string]any)
		file, _ := md["aws:asset:path"].(string)
		if file == "" {
			return fmt.Errorf("stack %s: nested stack %s names no template file", s.name, id)
		}
		params := map[string]any{}
		given, _ := props(r)["Parameters"].(map[string]any)
		for k, v := range given {
			rv, err := s.resolve(v)
			if err != nil {
				return fmt.Errorf("stack %s: nested stack %s parameter %s: %w", s.name, id, k, err)
			}
			params[k] = rv
		}
		physical := s.physical[id]
		if physical == "" {
			return fmt.Errorf("stack %s: nested stack %s is not deployed", s.name, id)
		}
		nested, err := readStack(ctx, cfn, dir, file, physical, id, params, s.region, s.account)
		if err != nil {
			return err
		}
		if err := nested.collect(ctx, cfn, dir, p); err != nil {
			return err
		}
	}
	return nil
}

// policy resolves a policy document of the template and parses it.
func (s *scope) policy(name string, doc any) (*iampolicy.Policy, error) {
	resolved, err := s.resolve(doc)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	b, err := json.Marshal(resolved)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	return iampolicy.Parse(name, b)
}

func refOf(v any) (string, bool) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return "", false
	}
	id, ok := m["Ref"].(string)
	return id, ok
}

func getAttOf(v any) (string, bool) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return "", false
	}
	ga, _ := m["Fn::GetAtt"].([]any)
	if len(ga) != 2 || ga[1] != "Arn" {
		return "", false
	}
	id, ok := ga[0].(string)
	return id, ok
}

func (s *scope) str(v any) (string, error) {
	r, err := s.resolve(v)
	if err != nil {
		return "", err
	}
	str, ok := r.(string)
	if !ok {
		return "", fmt.Errorf("%v is not a string", r)
	}
	return str, nil
}

// resolve replaces the intrinsic functions in v by their values.
func (s *scope) resolve(v any) (any, error) {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			r, err := s.resolve(e)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	case map[string]any:
		if len(v) == 1 {
			for k, arg := range v {
				if k == "Ref" || strings.HasPrefix(k, "Fn::") {
					return s.intrinsic(k, arg)
				}
			}
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			r, err := s.resolve(e)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	}
	return v, nil
}

func (s *scope) intrinsic(fn string, arg any) (any, error) {
	switch fn {
	case "Ref":
		name, _ := arg.(string)
		return s.ref(name)
	case "Fn::GetAtt":
		ga, _ := arg.([]any)
		if len(ga) != 2 {
			return nil, fmt.Errorf("Fn::GetAtt %v", arg)
		}
		id, _ := ga[0].(string)
		attr, _ := ga[1].(string)
		return s.getAtt(id, attr)
	case "Fn::Join":
		a, _ := arg.([]any)
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Join %v", arg)
		}
		sep, _ := a[0].(string)
		parts, err := s.resolve(a[1])
		if err != nil {
			return nil, err
		}
		list, _ := parts.([]any)
		strs := make([]string, len(list))
		for i, p := range list {
			if strs[i], err = s.str(p); err != nil {
				return nil, fmt.Errorf("Fn::Join: %w", err)
			}
		}
		return strings.Join(strs, sep), nil
	case "Fn::Sub":
		return s.sub(arg)
	case "Fn::Select":
		a, _ := arg.([]any)
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Select %v", arg)
		}
		idx, err := s.resolve(a[0])
		if err != nil {
			return nil, err
		}
		list, err := s.resolve(a[1])
		if err != nil {
			return nil, err
		}
		var i int
		if _, err := fmt.Sscan(fmt.Sprint(idx), &i); err != nil {
			return nil, fmt.Errorf("Fn::Select index %v", idx)
		}
		l, _ := list.([]any)
		if i < 0 || i >= len(l) {
			return nil, fmt.Errorf("Fn::Select %d of %d", i, len(l))
		}
		return l[i], nil
	case "Fn::Split":
		a, _ := arg.([]any)
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Split %v", arg)
		}
		sep, _ := a[0].(string)
		str, err := s.str(a[1])
		if err != nil {
			return nil, err
		}
		var out []any
		for _, p := range strings.Split(str, sep) {
			out = append(out, p)
		}
		return out, nil
	}
	return nil, fmt.Errorf("intrinsic function %s is not supported", fn)
}

func (s *scope) ref(name string) (any, error) {
	switch name {
	case "AWS::Partition":
		return "aws", nil
	case "AWS::Region":
		return s.region, nil
	case "AWS::AccountId":
		return s.account, nil
	case "AWS::URLSuffix":
		return "amazonaws.com", nil
	case "AWS::StackName":
		return s.name, nil
	}
	if v, ok := s.params[name]; ok {
		return v, nil
	}
	if _, ok := s.resources[name]; ok {
		if p := s.physical[name]; p != "" {
			return p, nil
		}
		return nil, fmt.Errorf("stack %s: resource %s has no physical id", s.name, name)
	}
	return nil, fmt.Errorf("stack %s: Ref %s: no such parameter or resource", s.name, name)
}

// getAtt returns the attribute Arn (or Name) of a resource of the stack,
// built from its physical id as AWS forms it.
func (s *scope) getAtt(id, attr string) (string, error) {
	r, ok := s.resources[id]
	if !ok {
		return "", fmt.Errorf("stack %s: Fn::GetAtt %s.%s: no such resource", s.name, id, attr)
	}
	phys := s.physical[id]
	if phys == "" {
		return "", fmt.Errorf("stack %s: resource %s has no physical id", s.name, id)
	}
	typ, _ := r["Type"].(string)
	arn := func(service, res string) string {
		return "arn:aws:" + service + ":" + s.region + ":" + s.account + ":" + res
	}
	if attr == "Arn" && strings.HasPrefix(phys, "arn:") {
		return phys, nil
	}
	switch typ + "." + attr {
	case "AWS::SQS::Queue.Arn":
		return arn("sqs", queueName(phys)), nil
	case "AWS::SQS::Queue.QueueName":
		return queueName(phys), nil
	case "AWS::S3::Bucket.Arn":
		return "arn:aws:s3:::" + phys, nil
	case "AWS::DynamoDB::Table.Arn":
		return arn("dynamodb", "table/"+phys), nil
	case "AWS::Logs::LogGroup.Arn":
		return arn("logs", "log-group:"+phys+":*"), nil
	case "AWS::IAM::Role.Arn":
		return "arn:aws:iam::" + s.account + ":role/" + phys, nil
	case "AWS::Lambda::Function.Arn":
		return arn("lambda", "function:"+phys), nil
	case "AWS::KMS::Key.Arn":
		return arn("kms", "key/"+phys), nil
	}
	return "", fmt.Errorf("stack %s: Fn::GetAtt %s.%s of a %s is not supported", s.name, id, attr, typ)
}

// queueName is the name of a queue given by URL or name.
func queueName(physical string) string {
	if u, err := url.Parse(physical); err == nil && u.Host != "" {
		return u.Path[strings.LastIndex(u.Path, "/")+1:]
	}
	return physical
}

// sub resolves Fn::Sub: ${Name} and ${Resource.Attr}, with its variables.
func (s *scope) sub(arg any) (any, error) {
	var tmpl string
	vars := map[string]any{}
	switch a := arg.(type) {
	case string:
		tmpl = a
	case []any:
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::Sub %v", arg)
		}
		tmpl, _ = a[0].(string)
		m, _ := a[1].(map[string]any)
		for k, v := range m {
			r, err := s.resolve(v)
			if err != nil {
				return nil, err
			}
			vars[k] = r
		}
	default:
		return nil, fmt.Errorf("Fn::Sub %v", arg)
	}
	var b strings.Builder
	for {
		i := strings.Index(tmpl, "${")
		if i < 0 {
			b.WriteString(tmpl)
			return b.String(), nil
		}
		j := strings.Index(tmpl[i:], "}")
		if j < 0 {
			return nil, fmt.Errorf("Fn::Sub %q: unclosed ${", tmpl)
		}
		b.WriteString(tmpl[:i])
		name := tmpl[i+2 : i+j]
		tmpl = tmpl[i+j+1:]
		if strings.HasPrefix(name, "!") {
			b.WriteString("${" + name[1:] + "}")
			continue
		}
		var v any
		var err error
		if val, ok := vars[name]; ok {
			v = val
		} else if res, attr, ok := strings.Cut(name, "."); ok {
			v, err = s.getAtt(res, attr)
		} else {
			v, err = s.ref(name)
		}
		if err != nil {
			return nil, fmt.Errorf("Fn::Sub: %w", err)
		}
		str, ok := v.(string)
		if !ok {
			return nil, errors.New("Fn::Sub: " + name + " is not a string")
		}
		b.WriteString(str)
	}
}
