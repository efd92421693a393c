//! Payment (clause 2.5): a customer pays; the warehouse's, district's and customer's
//! balances move, and the payment goes into the history.

use super::{customer, get, set};
use crate::schema::{TIMESTAMP, col};
use crate::values::{dec_of, int, int_of, ints, text, text_of};
use gyre_replica::{Column, ColumnType, Procedure, Result, Txn, Value};

/// `tpcc_payment(w_id, d_id, c_w_id, c_d_id, c_id, c_last, h_amount, h_date)`: the
/// customer by number (`c_last` NULL) or by last name (`c_id` NULL).
pub struct Payment;

/// What a bad-credit customer's `c_data` keeps (clause 2.5.2.2).
const C_DATA_MAX: usize = 500;

impl Procedure for Payment {
    fn name(&self) -> &str {
        "tpcc_payment"
    }

    fn params(&self) -> Vec<Column> {
        let c = |n: &str, t, nullable| Column::new(n, t, nullable);
        vec![
            c("w_id", ColumnType::Int32, false),
            c("d_id", ColumnType::Int32, false),
            c("c_w_id", ColumnType::Int32, false),
            c("c_d_id", ColumnType::Int32, false),
            c("c_id", ColumnType::Int32, true),
            c("c_last", ColumnType::Text, true),
            c(
                "h_amount",
                ColumnType::Decimal {
                    precision: 6,
                    scale: 2,
                },
                false,
            ),
            c("h_date", TIMESTAMP, false),
        ]
    }

    fn returns(&self) -> Vec<Column> {
        let c = |n: &str, t| Column::new(n, t, false);
        vec![
            c("c_id", ColumnType::Int32),
            c("c_last", ColumnType::Text),
            c(
                "c_balance",
                ColumnType::Decimal {
                    precision: 12,
                    scale: 2,
                },
            ),
            c("c_credit", ColumnType::Text),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, d, c_w, c_d] = ints(args);
        let amount = args[6].as_decimal().unwrap_or_default();
        if amount <= 0 {
            return Err(Txn::abort("a payment's amount is positive"));
        }
        let h_date = args[7].clone();

        // Each row is let go of before it changes, so that it changes in place.
        let warehouse = txn.table("warehouse")?;
        let w_key = [int(w)];
        let w_row = get(txn, warehouse, &w_key, "warehouse")?;
        let w_ytd = dec_of(&w_row, col::warehouse::YTD) + amount;
        let w_name = w_row[col::warehouse::NAME].clone();
        drop(w_row);
        set(
            txn,
            warehouse,
            &w_key,
            [(col::warehouse::YTD, Value::Decimal(w_ytd))],
        )?;
        let district = txn.table("district")?;
        let d_key = [int(w), int(d)];
        let d_row = get(txn, district, &d_key, "district")?;
        let d_ytd = dec_of(&d_row, col::district::YTD) + amount;
        let d_name = d_row[col::district::NAME].clone();
        drop(d_row);
        set(
            txn,
            district,
            &d_key,
            [(col::district::YTD, Value::Decimal(d_ytd))],
        )?;

        let c_row = customer(txn, c_w, c_d, &args[4], &args[5])?;
        let c_id = int_of(&c_row, col::customer::ID);
        let balance = dec_of(&c_row, col::customer::BALANCE) - amount;
        let payments = int_of(&c_row, col::customer::PAYMENT_CNT) + 1;
        let credit = text_of(&c_row, col::customer::CREDIT).to_string();
        let mut changes = vec![
            (col::customer::BALANCE, Value::Decimal(balance)),
            (
                col::customer::YTD_PAYMENT,
                Value::Decimal(dec_of(&c_row, col::customer::YTD_PAYMENT) + amount),
            ),
            (col::customer::PAYMENT_CNT, int(payments)),
        ];
        if credit == "BC" {
            let mut data = format!(
                "{c_id} {c_d} {c_w} {d} {w} {}.{:02} ",
                amount / 100,
                amount % 100
            );
            data.push_str(text_of(&c_row, col::customer::DATA));
            data.truncate(C_DATA_MAX);
            changes.push((col::customer::DATA, text(data)));
        }
        let c_last = c_row[col::customer::LAST].clone();
        drop(c_row);
        let customer_table = txn.table("customer")?;
        set(
            txn,
            customer_table,
            &[int(c_w), int(c_d), int(c_id)],
            changes,
        )?;

        let h_data = format!(
            "{}    {}",
            w_name.as_text().unwrap_or_default(),
            d_name.as_text().unwrap_or_default()
        );
        let history = txn.table("history")?;
        txn.insert(
            history,
            vec![
                int(c_id),
                int(c_d),
                int(c_w),
                int(d),
                int(w),
                h_date,
                Value::Decimal(amount),
                text(h_data),
                int(payments),
            ],
        )?;
        Ok(vec![vec![
            int(c_id),
            c_last,
            Value::Decimal(balance),
            text(credit),
        ]])
    }
}
