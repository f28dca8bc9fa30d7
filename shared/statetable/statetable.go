// Package statetable holds what the users of the stack's state table share:
// its key attribute, its creation, and the reads of the items under a key
// prefix. The table is one DynamoDB table keyed by job_id (a string). Besides
// the job items (package lease) it holds halt records, outage records,
// quarantine entries and redrive journal entries, whose keys contain a '/' that job ids cannot
// contain.
package statetable

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// KeyAttr is the table's partition key, a string.
const KeyAttr = "job_id"

// Key is the key of the item k.
func Key(k string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{KeyAttr: &types.AttributeValueMemberS{Value: k}}
}

// Creator is the part of the DynamoDB client Create calls.
type Creator interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	dynamodb.DescribeTableAPIClient
}

// Create creates the table (on-demand billing) and waits until it is
// active. A table that already exists is kept, so Create is idempotent.
func Create(ctx context.Context, db Creator, name string) error {
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            &name,
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(KeyAttr), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(KeyAttr), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("create table %s: %w", name, err)
	}
	w := dynamodb.NewTableExistsWaiter(db)
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: &name}, time.Minute); err != nil {
		return fmt.Errorf("wait for table %s: %w", name, err)
	}
	return nil
}

// Scanner is the DynamoDB call ScanPrefix makes.
type Scanner interface {
	Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

// ScanPrefix returns every item of table whose key begins with prefix, read
// with strongly consistent reads, in no particular order. It scans the whole
// table, which holds one item per job besides such entries, so it is cheap.
func ScanPrefix(ctx context.Context, db Scanner, table, prefix string) ([]map[string]types.AttributeValue, error) {
	p := dynamodb.NewScanPaginator(db, &dynamodb.ScanInput{
		TableName:                 &table,
		ConsistentRead:            aws.Bool(true),
		FilterExpression:          aws.String("begins_with(#k, :p)"),
		ExpressionAttributeNames:  map[string]string{"#k": KeyAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: prefix}},
	})
	var items []map[string]types.AttributeValue
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("scan %s for %q: %w", table, prefix, err)
		}
		items = append(items, page.Items...)
	}
	return items, nil
}

// String is the string attribute name of item; "" when it is absent or not
// a string.
func String(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// Int is the number attribute name of item; 0 when it is absent or not an
// integer.
func Int(item map[string]types.AttributeValue, name string) int64 {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		n, _ := strconv.ParseInt(v.Value, 10, 64)
		return n
	}
	return 0
}

// Time is the RFC 3339 time held in the string attribute name of item; the
// zero time when it is absent or not a time.
func Time(item map[string]types.AttributeValue, name string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, String(item, name))
	return t
}

// Str is a string attribute value.
func Str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

// Num is a number attribute value.
func Num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// Stamp is t as a string attribute value in UTC, RFC 3339 with nanoseconds:
// what Time reads back.
func Stamp(t time.Time) types.AttributeValue { return Str(t.UTC().Format(time.RFC3339Nano)) }
