package config

import "fmt"

// The names of the AWS resources. The local bootstrap and the CDK stack both use
// these functions, so a stack deployed by either finds the same resources.

// TableName is the DynamoDB table holding one item per job (lease and checkpoint).
func (f *File) TableName() string { return f.Stack.Prefix + "-state" }

// QueueName is the work queue of one (job, output).
func (f *File) QueueName(j *Job, o *Output) string {
	return f.Stack.Prefix + "-" + j.ID + "-" + o.ID + o.queueSuffix()
}

// DLQName is the dead-letter queue of one (job, output).
func (f *File) DLQName(j *Job, o *Output) string {
	return f.Stack.Prefix + "-" + j.ID + "-" + o.ID + "-dlq" + o.queueSuffix()
}

// Functions of a job, each deployed as <prefix>-<job>-<function>. The verify
// function compares an output with the source, and repairs it, from inside
// the stack (`changesctl verify --remote`).
const (
	FunctionPoller = "poller"
	FunctionWriter = "writer"
	FunctionVerify = "verify"
)

// FunctionName is the name of job j's function fn (FunctionPoller,
// FunctionWriter or FunctionVerify).
func (f *File) FunctionName(j *Job, fn string) string { return f.Stack.Prefix + "-" + j.ID + "-" + fn }

// ScheduleName is the name of the rule that starts job j's poller.
func (f *File) ScheduleName(j *Job) string { return f.Stack.Prefix + "-" + j.ID + "-schedule" }

// FIFO reports whether the output's queues are FIFO queues.
func (o *Output) FIFO() bool { return o.Ordering == OrderingPerDocument || o.Ordering == OrderingTotal }

// Halts reports whether a change that cannot be delivered stops its message
// group instead of going to the DLQ.
func (o *Output) Halts() bool { return o.OnFailure == OnFailureHalt }

// QueueMaxReceiveCount is the work queue's redrive maxReceiveCount: the
// output's max_receive_count on a standard queue; SQS's maximum on a FIFO
// queue, whose writer counts max_receive_count itself and keeps a held or
// halted change at the head of its group instead of letting SQS
// dead-letter it.
func (o *Output) QueueMaxReceiveCount() int {
	if o.FIFO() {
		return 1000
	}
	return o.MaxReceiveCount
}

func (o *Output) queueSuffix() string {
	if o.FIFO() {
		return ".fifo"
	}
	return ""
}

// ClaimCheckPrefix is the key prefix of claim-check payloads in the stack bucket.
const ClaimCheckPrefix = "claim-check/"

// Route is a resolved (job, output) pair.
type Route struct {
	Job    *Job
	Output *Output
}

// RouteByQueueName finds the (job, output) whose work queue has the given name.
func (f *File) RouteByQueueName(name string) (Route, bool) {
	for _, j := range f.Jobs {
		for _, o := range j.Outputs {
			if f.QueueName(j, o) == name {
				return Route{Job: j, Output: o}, true
			}
		}
	}
	return Route{}, false
}

// maxQueueName is SQS's limit on a queue name, .fifo included.
const maxQueueName = 80

// checkNames refuses (job, output) pairs whose resources would share a name:
// job and output ids join with '-', so "orders-pg"/"x" and "orders"/"pg-x"
// would share their queues (messages of one delivered by the other's
// writer), alarms and stack resources; and a queue may not be named like
// another pair's DLQ ("a"/"b-dlq" and the DLQ of "a"/"b"). It also refuses
// queue names longer than SQS allows. Each problem names both pairs.
func (f *File) checkNames() []error {
	var errs []error
	owners := map[string]string{} // "route <job>-<output>" or "queue <name>" → owner
	reported := map[[2]string]bool{}
	for _, j := range f.Jobs {
		if j == nil {
			continue
		}
		for _, o := range j.Outputs {
			if o == nil {
				continue
			}
			label := fmt.Sprintf("jobs[%s].outputs[%s]", j.ID, o.ID)
			queue, dlq := f.QueueName(j, o), f.DLQName(j, o)
			for _, key := range []string{"route " + j.ID + "-" + o.ID, "queue " + queue, "queue " + dlq} {
				other, taken := owners[key]
				if !taken {
					owners[key] = label
					continue
				}
				if other == label || reported[[2]string{other, label}] {
					continue
				}
				reported[[2]string{other, label}] = true
				if key[0] == 'r' {
					errs = append(errs, fmt.Errorf("%s: its queues, alarms and other resources would be named %q like those of %s: rename one of the ids", label, f.Stack.Prefix+"-"+j.ID+"-"+o.ID, other))
				} else {
					errs = append(errs, fmt.Errorf("%s: its queue name %q is also a queue name of %s: rename one of the ids", label, key[len("queue "):], other))
				}
			}
			if len(dlq) > maxQueueName {
				errs = append(errs, fmt.Errorf("%s: queue name %q has %d characters, SQS allows %d: shorten stack.prefix, the job id or the output id", label, dlq, len(dlq), maxQueueName))
			}
		}
	}
	return errs
}
