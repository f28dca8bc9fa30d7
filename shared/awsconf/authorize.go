package awsconf

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/changes-worker/changes-worker/shared/iampolicy"
	"github.com/changes-worker/changes-worker/shared/statetable"
)

// authorizations returns what IAM authorises for one SDK operation, read
// from its input (and, for an ARN only the answer holds, its output): the
// actions, each on its resource ARN, with the condition keys the stack's
// policies use. The mapping follows the Service Authorization Reference
// ("Actions, resources, and condition keys for <service>", including its
// table mapping API operations to actions), the SQS Developer Guide's "API
// permissions: Actions and resource reference" and the S3 User Guide's
// "Required permissions for Amazon S3 API operations". Where an operation
// is authorised under another name, its entry says so. An operation
// without an entry is an error: a new call must be mapped before it can be
// checked.
func authorizations(service, operation string, input, output any, region, account string) ([]iampolicy.Request, error) {
	m, ok := operations[service+" "+operation]
	if !ok {
		return nil, fmt.Errorf("no IAM mapping for %s %s (shared/awsconf/authorize.go)", service, operation)
	}
	o := &opArgs{in: deref(input), out: deref(output), partition: partitionOf(region), region: region, account: account}
	reqs, err := m(o)
	if err != nil {
		return nil, fmt.Errorf("map %s %s to IAM: %w", service, operation, err)
	}
	return reqs, nil
}

// opArgs is what a mapping reads.
type opArgs struct {
	in, out                    reflect.Value // the input and output structs (output invalid when the call failed)
	partition, region, account string
}

func deref(v any) reflect.Value { return elem(reflect.ValueOf(v)) }

// elem follows pointers and interfaces down to the value (invalid for nil).
func elem(v reflect.Value) reflect.Value {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		v = v.Elem()
	}
	return v
}

// get returns the field name of the struct v points at (invalid when v is
// nil or not a struct, or has no such field).
func get(v reflect.Value, name string) reflect.Value {
	v = elem(v)
	if !v.IsValid() || v.Kind() != reflect.Struct {
		return reflect.Value{}
	}
	return v.FieldByName(name)
}

// str returns the string field name of the struct v points at ("" when
// absent or nil).
func str(v reflect.Value, name string) string {
	f := elem(get(v, name))
	if f.IsValid() && f.Kind() == reflect.String {
		return f.String()
	}
	return ""
}

func partitionOf(region string) string {
	switch {
	case strings.HasPrefix(region, "cn-"):
		return "aws-cn"
	case strings.HasPrefix(region, "us-gov-"):
		return "aws-us-gov"
	}
	return "aws"
}

func (o *opArgs) arn(service, resource string) string {
	return "arn:" + o.partition + ":" + service + ":" + o.region + ":" + o.account + ":" + resource
}

// one is a mapping to one action on one resource.
func one(action string, resource func(*opArgs) (string, error)) func(*opArgs) ([]iampolicy.Request, error) {
	return func(o *opArgs) ([]iampolicy.Request, error) {
		r, err := resource(o)
		if err != nil {
			return nil, err
		}
		return []iampolicy.Request{{Action: action, Resource: r}}, nil
	}
}

func anyResource(*opArgs) (string, error) { return "*", nil }

// operations maps "<service id> <operation>" to its authorisations.
var operations = map[string]func(*opArgs) ([]iampolicy.Request, error){
	// STS: GetCallerIdentity needs no permission.
	"STS GetCallerIdentity": func(*opArgs) ([]iampolicy.Request, error) { return nil, nil },

	// SQS. The batch operations are authorised as their single form.
	"SQS SendMessage":                  one("sqs:SendMessage", queueURL),
	"SQS SendMessageBatch":             one("sqs:SendMessage", queueURL),
	"SQS ReceiveMessage":               one("sqs:ReceiveMessage", queueURL),
	"SQS DeleteMessage":                one("sqs:DeleteMessage", queueURL),
	"SQS DeleteMessageBatch":           one("sqs:DeleteMessage", queueURL),
	"SQS ChangeMessageVisibility":      one("sqs:ChangeMessageVisibility", queueURL),
	"SQS ChangeMessageVisibilityBatch": one("sqs:ChangeMessageVisibility", queueURL),
	"SQS GetQueueAttributes":           one("sqs:GetQueueAttributes", queueURL),
	"SQS SetQueueAttributes":           one("sqs:SetQueueAttributes", queueURL),
	"SQS PurgeQueue":                   one("sqs:PurgeQueue", queueURL),
	"SQS DeleteQueue":                  one("sqs:DeleteQueue", queueURL),
	"SQS ListDeadLetterSourceQueues":   one("sqs:ListDeadLetterSourceQueues", queueURL),
	"SQS GetQueueUrl":                  one("sqs:GetQueueUrl", queueName),
	"SQS CreateQueue":                  one("sqs:CreateQueue", queueName),
	"SQS ListMessageMoveTasks":         one("sqs:ListMessageMoveTasks", field("SourceArn")),
	// A move task needs, on its source (the DLQ), the right to start it and
	// to receive, delete and read the attributes of its messages, and on its
	// destination, to send them.
	"SQS StartMessageMoveTask": func(o *opArgs) ([]iampolicy.Request, error) {
		src := str(o.in, "SourceArn")
		if src == "" {
			return nil, errors.New("no SourceArn")
		}
		reqs := moveTaskSource("sqs:StartMessageMoveTask", src)
		if dst := str(o.in, "DestinationArn"); dst != "" {
			reqs = append(reqs, iampolicy.Request{Action: "sqs:SendMessage", Resource: dst})
		}
		return reqs, nil
	},
	"SQS CancelMessageMoveTask": func(o *opArgs) ([]iampolicy.Request, error) {
		src, err := taskSource(str(o.in, "TaskHandle"))
		if err != nil {
			return nil, err
		}
		return moveTaskSource("sqs:CancelMessageMoveTask", src), nil
	},

	// DynamoDB. Item operations carry dynamodb:LeadingKeys, the partition
	// key values they touch; TransactWriteItems and TransactGetItems are
	// authorised item by item as the underlying item operation.
	"DynamoDB GetItem":            item("dynamodb:GetItem", "Key"),
	"DynamoDB PutItem":            item("dynamodb:PutItem", "Item"),
	"DynamoDB UpdateItem":         item("dynamodb:UpdateItem", "Key"),
	"DynamoDB DeleteItem":         item("dynamodb:DeleteItem", "Key"),
	"DynamoDB Query":              query,
	"DynamoDB Scan":               one("dynamodb:Scan", tableName),
	"DynamoDB BatchGetItem":       batchGet,
	"DynamoDB BatchWriteItem":     batchWrite,
	"DynamoDB TransactWriteItems": transactWrite,
	"DynamoDB TransactGetItems":   transactGet,
	"DynamoDB DescribeTable":      one("dynamodb:DescribeTable", tableName),
	"DynamoDB CreateTable":        one("dynamodb:CreateTable", tableName),
	"DynamoDB DeleteTable":        one("dynamodb:DeleteTable", tableName),
	"DynamoDB UpdateTable":        one("dynamodb:UpdateTable", tableName),
	"DynamoDB DescribeTimeToLive": one("dynamodb:DescribeTimeToLive", tableName),
	"DynamoDB UpdateTimeToLive":   one("dynamodb:UpdateTimeToLive", tableName),
	"DynamoDB ListTables":         one("dynamodb:ListTables", anyResource),

	// S3. HeadObject is authorised as s3:GetObject, the multipart upload's
	// calls but its abort as s3:PutObject, ListObjects(V2) and HeadBucket as
	// s3:ListBucket on the bucket (the listing with s3:prefix, "" for
	// none), DeleteObjects as s3:DeleteObject per key, CopyObject as
	// s3:PutObject on the copy and s3:GetObject on its source.
	"S3 GetObject":                       object("s3:GetObject", "s3:GetObjectVersion"),
	"S3 HeadObject":                      object("s3:GetObject", "s3:GetObjectVersion"),
	"S3 PutObject":                       object("s3:PutObject", ""),
	"S3 CreateMultipartUpload":           object("s3:PutObject", ""),
	"S3 UploadPart":                      object("s3:PutObject", ""),
	"S3 CompleteMultipartUpload":         object("s3:PutObject", ""),
	"S3 AbortMultipartUpload":            object("s3:AbortMultipartUpload", ""),
	"S3 ListParts":                       object("s3:ListMultipartUploadParts", ""),
	"S3 DeleteObject":                    object("s3:DeleteObject", "s3:DeleteObjectVersion"),
	"S3 DeleteObjects":                   deleteObjects,
	"S3 CopyObject":                      copyObject,
	"S3 UploadPartCopy":                  copyObject,
	"S3 ListObjectsV2":                   listBucket("s3:ListBucket"),
	"S3 ListObjects":                     listBucket("s3:ListBucket"),
	"S3 ListObjectVersions":              listBucket("s3:ListBucketVersions"),
	"S3 HeadBucket":                      one("s3:ListBucket", bucket),
	"S3 CreateBucket":                    one("s3:CreateBucket", bucket),
	"S3 DeleteBucket":                    one("s3:DeleteBucket", bucket),
	"S3 GetBucketLocation":               one("s3:GetBucketLocation", bucket),
	"S3 GetBucketPolicy":                 one("s3:GetBucketPolicy", bucket),
	"S3 GetBucketLifecycleConfiguration": one("s3:GetLifecycleConfiguration", bucket),
	"S3 PutBucketLifecycleConfiguration": one("s3:PutLifecycleConfiguration", bucket),
	"S3 GetBucketEncryption":             one("s3:GetEncryptionConfiguration", bucket),
	"S3 GetPublicAccessBlock":            one("s3:GetBucketPublicAccessBlock", bucket),
	"S3 GetBucketVersioning":             one("s3:GetBucketVersioning", bucket),
	"S3 ListBuckets":                     one("s3:ListAllMyBuckets", anyResource),

	// Secrets Manager: on the secret's ARN, which a name resolves to
	// (name-XXXXXX); the answer gives it, else the name's pattern stands in.
	"Secrets Manager GetSecretValue": one("secretsmanager:GetSecretValue", secret),
	"Secrets Manager DescribeSecret": one("secretsmanager:DescribeSecret", secret),
	"Secrets Manager PutSecretValue": one("secretsmanager:PutSecretValue", secret),
	"Secrets Manager DeleteSecret":   one("secretsmanager:DeleteSecret", secret),
	"Secrets Manager CreateSecret": one("secretsmanager:CreateSecret", func(o *opArgs) (string, error) {
		return o.secretARN(str(o.in, "Name"))
	}),
	"Secrets Manager ListSecrets": one("secretsmanager:ListSecrets", anyResource),

	// CloudFormation: on the stack's ARN (stack/NAME/ID); the answer of
	// DescribeStacks gives it, else stack/NAME/* stands in.
	"CloudFormation DescribeStacks":         one("cloudformation:DescribeStacks", stack),
	"CloudFormation DescribeStackResources": one("cloudformation:DescribeStackResources", stack),
	"CloudFormation DescribeStackResource":  one("cloudformation:DescribeStackResource", stack),
	"CloudFormation ListStackResources":     one("cloudformation:ListStackResources", stack),
	"CloudFormation DescribeStackEvents":    one("cloudformation:DescribeStackEvents", stack),
	"CloudFormation GetTemplate":            one("cloudformation:GetTemplate", stack),

	// Lambda: Invoke is lambda:InvokeFunction; event source mappings are
	// resources of their own (event-source-mapping:UUID).
	"Lambda Invoke":                      one("lambda:InvokeFunction", function),
	"Lambda GetFunction":                 one("lambda:GetFunction", function),
	"Lambda GetFunctionConfiguration":    one("lambda:GetFunctionConfiguration", function),
	"Lambda UpdateFunctionConfiguration": one("lambda:UpdateFunctionConfiguration", function),
	"Lambda ListEventSourceMappings":     one("lambda:ListEventSourceMappings", anyResource),
	"Lambda CreateEventSourceMapping":    one("lambda:CreateEventSourceMapping", anyResource),
	"Lambda GetEventSourceMapping":       one("lambda:GetEventSourceMapping", eventSourceMapping),
	"Lambda UpdateEventSourceMapping":    one("lambda:UpdateEventSourceMapping", eventSourceMapping),
	"Lambda DeleteEventSourceMapping":    one("lambda:DeleteEventSourceMapping", eventSourceMapping),

	// EventBridge: a rule is rule/NAME on the default event bus, rule/BUS/NAME
	// on another.
	"EventBridge DescribeRule": one("events:DescribeRule", rule),
	"EventBridge DisableRule":  one("events:DisableRule", rule),
	"EventBridge EnableRule":   one("events:EnableRule", rule),

	// CloudWatch: metric data takes no resource.
	"CloudWatch PutMetricData":       one("cloudwatch:PutMetricData", anyResource),
	"CloudWatch GetMetricData":       one("cloudwatch:GetMetricData", anyResource),
	"CloudWatch GetMetricStatistics": one("cloudwatch:GetMetricStatistics", anyResource),
}

// field returns the input's string field name, required.
func field(name string) func(*opArgs) (string, error) {
	return func(o *opArgs) (string, error) {
		if v := str(o.in, name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("no %s", name)
	}
}

// queueURL is the ARN of the queue of the input's QueueUrl
// (https://host/ACCOUNT/NAME).
func queueURL(o *opArgs) (string, error) {
	raw := str(o.in, "QueueUrl")
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("queue URL %q: %w", raw, err)
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) < 2 || parts[len(parts)-2] == "" || parts[len(parts)-1] == "" {
		return "", fmt.Errorf("queue URL %q: want .../ACCOUNT/NAME", raw)
	}
	acct, name := parts[len(parts)-2], parts[len(parts)-1]
	return "arn:" + o.partition + ":sqs:" + o.region + ":" + acct + ":" + name, nil
}

// queueName is the ARN of the queue the input names (QueueName, in
// QueueOwnerAWSAccountId's account or this one).
func queueName(o *opArgs) (string, error) {
	name := str(o.in, "QueueName")
	if name == "" {
		return "", errors.New("no QueueName")
	}
	acct := str(o.in, "QueueOwnerAWSAccountId")
	if acct == "" {
		acct = o.account
	}
	return "arn:" + o.partition + ":sqs:" + o.region + ":" + acct + ":" + name, nil
}

func moveTaskSource(action, src string) []iampolicy.Request {
	var reqs []iampolicy.Request
	for _, a := range []string{action, "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"} {
		reqs = append(reqs, iampolicy.Request{Action: a, Resource: src})
	}
	return reqs
}

// taskSource reads the source queue's ARN from a move task's handle, base64
// of JSON naming it.
func taskSource(handle string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(handle)
	if err != nil {
		b, err = base64.RawURLEncoding.DecodeString(handle)
	}
	var h map[string]any
	if err != nil || json.Unmarshal(b, &h) != nil {
		return "", errors.New("TaskHandle: not base64 JSON")
	}
	for k, v := range h {
		if s, ok := v.(string); ok && strings.EqualFold(k, "sourceArn") {
			return s, nil
		}
	}
	return "", errors.New("TaskHandle: no sourceArn")
}

// tableARN is the ARN of a table given by name or ARN.
func (o *opArgs) tableARN(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("no TableName")
	case strings.HasPrefix(name, "arn:"):
		return name, nil
	}
	return o.arn("dynamodb", "table/"+name), nil
}

func tableName(o *opArgs) (string, error) { return o.tableARN(str(o.in, "TableName")) }

// leadingKey returns the partition key value of an item or key (a
// map[string]types.AttributeValue): the string attribute
// statetable.KeyAttr, the partition key of the stack's only table.
func leadingKey(m reflect.Value) (string, error) {
	m = elem(m)
	if !m.IsValid() || m.Kind() != reflect.Map {
		return "", errors.New("no item key")
	}
	k, ok := stringAttr(m.MapIndex(reflect.ValueOf(statetable.KeyAttr)))
	if !ok {
		return "", fmt.Errorf("the item has no string %s", statetable.KeyAttr)
	}
	return k, nil
}

// stringAttr returns the value of a string attribute
// (types.AttributeValueMemberS).
func stringAttr(v reflect.Value) (string, bool) {
	v = elem(v)
	if !v.IsValid() || v.Kind() != reflect.Struct || get(v, "Value").Kind() != reflect.String {
		return "", false
	}
	return get(v, "Value").String(), true
}

// item maps an item operation on TableName, whose partition key is read
// from the input's field keyField (Key or Item).
func item(action, keyField string) func(*opArgs) ([]iampolicy.Request, error) {
	return func(o *opArgs) ([]iampolicy.Request, error) {
		table, err := tableName(o)
		if err != nil {
			return nil, err
		}
		k, err := leadingKey(get(o.in, keyField))
		if err != nil {
			return nil, err
		}
		return []iampolicy.Request{leading(action, table, k)}, nil
	}
}

func leading(action, table string, keys ...string) iampolicy.Request {
	sort.Strings(keys)
	keys = slices.Compact(keys)
	return iampolicy.Request{Action: action, Resource: table, Context: map[string][]string{"dynamodb:LeadingKeys": keys}}
}

// query reads the partition key from a KeyConditionExpression of the form
// "<key> = :value [AND ...]", the key named directly or through
// ExpressionAttributeNames.
func query(o *opArgs) ([]iampolicy.Request, error) {
	table, err := tableName(o)
	if err != nil {
		return nil, err
	}
	expr := str(o.in, "KeyConditionExpression")
	names := get(o.in, "ExpressionAttributeNames")
	values := get(o.in, "ExpressionAttributeValues")
	for _, part := range strings.Split(expr, " AND ") {
		lhs, rhs, ok := strings.Cut(part, "=")
		if !ok {
			continue
		}
		lhs, rhs = strings.TrimSpace(strings.Trim(strings.TrimSpace(lhs), "()")), strings.TrimSpace(strings.Trim(strings.TrimSpace(rhs), "()"))
		if strings.HasPrefix(lhs, "#") && names.Kind() == reflect.Map {
			if n := names.MapIndex(reflect.ValueOf(lhs)); n.IsValid() {
				lhs = n.String()
			}
		}
		if lhs != statetable.KeyAttr || values.Kind() != reflect.Map {
			continue
		}
		k, ok := stringAttr(values.MapIndex(reflect.ValueOf(rhs)))
		if !ok {
			return nil, fmt.Errorf("KeyConditionExpression %q: %s is not a string value", expr, rhs)
		}
		return []iampolicy.Request{leading("dynamodb:Query", table, k)}, nil
	}
	return nil, fmt.Errorf("KeyConditionExpression %q: no %s = :value", expr, statetable.KeyAttr)
}

// batchGet: dynamodb:BatchGetItem per table, with the keys read there.
func batchGet(o *opArgs) ([]iampolicy.Request, error) {
	return perTable(o, "dynamodb:BatchGetItem", func(v reflect.Value) ([]reflect.Value, error) {
		keys := get(v, "Keys")
		var out []reflect.Value
		for i := 0; i < keys.Len(); i++ {
			out = append(out, keys.Index(i))
		}
		return out, nil
	})
}

// batchWrite: dynamodb:BatchWriteItem per table, with the keys written there.
func batchWrite(o *opArgs) ([]iampolicy.Request, error) {
	return perTable(o, "dynamodb:BatchWriteItem", func(v reflect.Value) ([]reflect.Value, error) {
		var out []reflect.Value
		for i := 0; i < v.Len(); i++ {
			w := v.Index(i)
			if put := elem(get(w, "PutRequest")); put.IsValid() {
				out = append(out, get(put, "Item"))
			} else if del := elem(get(w, "DeleteRequest")); del.IsValid() {
				out = append(out, get(del, "Key"))
			} else {
				return nil, errors.New("a write request with neither PutRequest nor DeleteRequest")
			}
		}
		return out, nil
	})
}

// perTable maps RequestItems (table → requests) to one request per table.
func perTable(o *opArgs, action string, keysOf func(reflect.Value) ([]reflect.Value, error)) ([]iampolicy.Request, error) {
	items := get(o.in, "RequestItems")
	if items.Kind() != reflect.Map || items.Len() == 0 {
		return nil, errors.New("no RequestItems")
	}
	var reqs []iampolicy.Request
	for _, t := range items.MapKeys() {
		table, err := o.tableARN(t.String())
		if err != nil {
			return nil, err
		}
		ks, err := keysOf(items.MapIndex(t))
		if err != nil {
			return nil, err
		}
		var keys []string
		for _, k := range ks {
			s, err := leadingKey(k)
			if err != nil {
				return nil, err
			}
			keys = append(keys, s)
		}
		reqs = append(reqs, leading(action, table, keys...))
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Resource < reqs[j].Resource })
	return reqs, nil
}

// transactWrite: each item as its own operation (Put, Update, Delete,
// ConditionCheck).
func transactWrite(o *opArgs) ([]iampolicy.Request, error) {
	return transact(o, map[string]string{"Put": "dynamodb:PutItem", "Update": "dynamodb:UpdateItem",
		"Delete": "dynamodb:DeleteItem", "ConditionCheck": "dynamodb:ConditionCheckItem"})
}

// transactGet: each item as dynamodb:GetItem.
func transactGet(o *opArgs) ([]iampolicy.Request, error) {
	return transact(o, map[string]string{"Get": "dynamodb:GetItem"})
}

func transact(o *opArgs, kinds map[string]string) ([]iampolicy.Request, error) {
	items := get(o.in, "TransactItems")
	if !items.IsValid() || items.Len() == 0 {
		return nil, errors.New("no TransactItems")
	}
	var reqs []iampolicy.Request
	for i := 0; i < items.Len(); i++ {
		it := items.Index(i)
		found := false
		for _, kind := range []string{"Put", "Update", "Delete", "ConditionCheck", "Get"} {
			action, ok := kinds[kind]
			op := elem(get(it, kind))
			if !ok || !op.IsValid() {
				continue
			}
			table, err := o.tableARN(str(op, "TableName"))
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			keyField := "Key"
			if kind == "Put" {
				keyField = "Item"
			}
			k, err := leadingKey(get(op, keyField))
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			reqs = append(reqs, leading(action, table, k))
			found = true
		}
		if !found {
			return nil, fmt.Errorf("item %d: no operation", i)
		}
	}
	return reqs, nil
}

func bucket(o *opArgs) (string, error) {
	b := str(o.in, "Bucket")
	if b == "" {
		return "", errors.New("no Bucket")
	}
	return "arn:" + o.partition + ":s3:::" + b, nil
}

// object maps an object operation; versioned is the action when the input
// names a VersionId ("" for none).
func object(action, versioned string) func(*opArgs) ([]iampolicy.Request, error) {
	return func(o *opArgs) ([]iampolicy.Request, error) {
		b, err := bucket(o)
		if err != nil {
			return nil, err
		}
		key := str(o.in, "Key")
		if key == "" {
			return nil, errors.New("no Key")
		}
		a := action
		if versioned != "" && str(o.in, "VersionId") != "" {
			a = versioned
		}
		return []iampolicy.Request{{Action: a, Resource: b + "/" + key}}, nil
	}
}

func deleteObjects(o *opArgs) ([]iampolicy.Request, error) {
	b, err := bucket(o)
	if err != nil {
		return nil, err
	}
	objs := get(get(o.in, "Delete"), "Objects")
	if !objs.IsValid() || objs.Len() == 0 {
		return nil, errors.New("no Delete.Objects")
	}
	var reqs []iampolicy.Request
	for i := 0; i < objs.Len(); i++ {
		obj := objs.Index(i)
		a := "s3:DeleteObject"
		if str(obj, "VersionId") != "" {
			a = "s3:DeleteObjectVersion"
		}
		reqs = append(reqs, iampolicy.Request{Action: a, Resource: b + "/" + str(obj, "Key")})
	}
	return reqs, nil
}

func copyObject(o *opArgs) ([]iampolicy.Request, error) {
	dst, err := object("s3:PutObject", "")(o)
	if err != nil {
		return nil, err
	}
	src := str(o.in, "CopySource")
	if i := strings.Index(src, "?versionId="); i >= 0 {
		src = src[:i]
	}
	if s, err := url.PathUnescape(src); err == nil {
		src = s
	}
	src = strings.TrimPrefix(src, "/")
	if !strings.Contains(src, "/") {
		return nil, fmt.Errorf("CopySource %q: want BUCKET/KEY", src)
	}
	return append(dst, iampolicy.Request{Action: "s3:GetObject", Resource: "arn:" + o.partition + ":s3:::" + src}), nil
}

func listBucket(action string) func(*opArgs) ([]iampolicy.Request, error) {
	return func(o *opArgs) ([]iampolicy.Request, error) {
		b, err := bucket(o)
		if err != nil {
			return nil, err
		}
		return []iampolicy.Request{{Action: action, Resource: b, Context: map[string][]string{"s3:prefix": {str(o.in, "Prefix")}}}}, nil
	}
}

// secretARN is the ARN of a secret given by ARN or by name (name-??????).
func (o *opArgs) secretARN(id string) (string, error) {
	switch {
	case id == "":
		return "", errors.New("no SecretId")
	case strings.HasPrefix(id, "arn:"):
		return id, nil
	}
	return o.arn("secretsmanager", "secret:"+id+"-??????"), nil
}

func secret(o *opArgs) (string, error) {
	if a := str(o.out, "ARN"); a != "" {
		return a, nil
	}
	return o.secretARN(str(o.in, "SecretId"))
}

func stack(o *opArgs) (string, error) {
	name := str(o.in, "StackName")
	if stacks := get(o.out, "Stacks"); stacks.IsValid() && stacks.Len() == 1 {
		if id := str(stacks.Index(0), "StackId"); id != "" {
			return id, nil
		}
	}
	switch {
	case name == "":
		return "*", nil
	case strings.HasPrefix(name, "arn:"):
		return name, nil
	}
	return o.arn("cloudformation", "stack/"+name+"/*"), nil
}

// function is the ARN of FunctionName (a name, a partial or a full ARN,
// with or without a qualifier).
func function(o *opArgs) (string, error) {
	name := str(o.in, "FunctionName")
	if name == "" {
		return "", errors.New("no FunctionName")
	}
	if strings.HasPrefix(name, "arn:") {
		return name, nil
	}
	if i := strings.Index(name, ":function:"); i >= 0 {
		return o.arn("lambda", "function:"+name[i+len(":function:"):]), nil
	}
	return o.arn("lambda", "function:"+name), nil
}

// rule is the ARN of the EventBridge rule Name, on EventBusName (a name or
// an ARN) or the default bus.
func rule(o *opArgs) (string, error) {
	name := str(o.in, "Name")
	if name == "" {
		return "", errors.New("no Name")
	}
	bus := str(o.in, "EventBusName")
	if i := strings.LastIndex(bus, ":event-bus/"); i >= 0 {
		bus = bus[i+len(":event-bus/"):]
	}
	if bus == "" || bus == "default" {
		return o.arn("events", "rule/"+name), nil
	}
	return o.arn("events", "rule/"+bus+"/"+name), nil
}

func eventSourceMapping(o *opArgs) (string, error) {
	id := str(o.in, "UUID")
	if id == "" {
		return "", errors.New("no UUID")
	}
	return o.arn("lambda", "event-source-mapping:"+id), nil
}
