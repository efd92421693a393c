//! New-Order (clause 2.4): enter an order of 5 to 15 lines, taking stock.

use super::{get, set};
use crate::schema::{TIMESTAMP, col};
use crate::values::{dec_of, int, int_of, ints};
use gyre_replica::{Column, ColumnType, Procedure, Result, Txn, Value};

/// `tpcc_new_order(w_id, d_id, c_id, item_ids, supply_w_ids, quantities, entry_d)`,
/// the three lists of equal length, one element per order line.
pub struct NewOrder;

/// The most lines an order may have (clause 2.4.1.3 draws 5 to 15).
const MAX_LINES: usize = 15;

/// The largest quantity of one line (the terminals draw 1 to 10).
const MAX_QUANTITY: i64 = 99;

impl Procedure for NewOrder {
    fn name(&self) -> &str {
        "tpcc_new_order"
    }

    fn params(&self) -> Vec<Column> {
        let c = |n: &str, t| Column::new(n, t, false);
        vec![
            c("w_id", ColumnType::Int32),
            c("d_id", ColumnType::Int32),
            c("c_id", ColumnType::Int32),
            c("item_ids", ColumnType::IntList),
            c("supply_w_ids", ColumnType::IntList),
            c("quantities", ColumnType::IntList),
            c("entry_d", TIMESTAMP),
        ]
    }

    fn returns(&self) -> Vec<Column> {
        let c = |n: &str, t| Column::new(n, t, false);
        vec![
            c("o_id", ColumnType::Int32),
            c("o_ol_cnt", ColumnType::Int32),
            c(
                "total_amount",
                ColumnType::Decimal {
                    precision: 12,
                    scale: 2,
                },
            ),
            c("c_last", ColumnType::Text),
            c("c_credit", ColumnType::Text),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, d, c] = ints(args);
        let lists = [3, 4, 5].map(|i| args[i].as_int_list().unwrap_or_default());
        let [items, supply, quantities] = lists;
        let lines = items.len();
        if !(1..=MAX_LINES).contains(&lines) || supply.len() != lines || quantities.len() != lines {
            return Err(Txn::abort(format!(
                "an order has 1 to {MAX_LINES} lines, each with an item, a supplying \
                 warehouse and a quantity; got {}, {} and {}",
                items.len(),
                supply.len(),
                quantities.len()
            )));
        }
        // ol_amount is DECIMAL(6, 2): 99 of the dearest item (100.00) fit.
        if let Some(q) = quantities.iter().find(|q| !(1..=MAX_QUANTITY).contains(*q)) {
            return Err(Txn::abort(format!(
                "quantity {q} is not in 1..={MAX_QUANTITY}"
            )));
        }
        let entry_d = args[6].clone();

        let warehouse = txn.table("warehouse")?;
        let w_row = get(txn, warehouse, &[int(w)], "warehouse")?;
        let w_tax = dec_of(&w_row, col::warehouse::TAX);
        drop(w_row);
        let district = txn.table("district")?;
        let d_key = [int(w), int(d)];
        let d_row = get(txn, district, &d_key, "district")?;
        let o_id = int_of(&d_row, col::district::NEXT_O_ID);
        let d_tax = dec_of(&d_row, col::district::TAX);
        drop(d_row);
        set(
            txn,
            district,
            &d_key,
            [(col::district::NEXT_O_ID, int(o_id + 1))],
        )?;
        let c_row = get(
            txn,
            txn.table("customer")?,
            &[int(w), int(d), int(c)],
            "customer",
        )?;

        let all_local = supply.iter().all(|s| *s == w);
        let orders = txn.table("orders")?;
        txn.insert(
            orders,
            vec![
                int(o_id),
                int(d),
                int(w),
                int(c),
                entry_d,
                Value::Null,
                int(lines as i64),
                int(all_local.into()),
            ],
        )?;
        let customer_order = txn.table("customer_order")?;
        txn.insert(customer_order, vec![int(w), int(d), int(c), int(o_id)])?;
        let new_order = txn.table("new_order")?;
        txn.insert(new_order, vec![int(o_id), int(d), int(w)])?;

        let item = txn.table("item")?;
        let stock = txn.table("stock")?;
        let order_line = txn.table("order_line")?;
        let mut sum: i128 = 0;
        for (n, ((&i, &s), &q)) in items.iter().zip(supply).zip(quantities).enumerate() {
            // An unused item number rolls the whole order back (clause 2.4.2.3).
            let Some(i_row) = txn.get(item, &[int(i)])? else {
                return Err(Txn::abort(format!("Item number is not valid: {i}")));
            };
            let price = dec_of(&i_row, col::item::PRICE);
            drop(i_row);
            let s_key = [int(s), int(i)];
            let s_row = get(txn, stock, &s_key, "stock")?;
            let s_quantity = int_of(&s_row, col::stock::QUANTITY);
            let left = if s_quantity >= q + 10 {
                s_quantity - q
            } else {
                s_quantity - q + 91
            };
            let remote = i64::from(s != w);
            let dist_info = s_row[col::stock::DIST_01 + d as usize - 1].clone();
            let changes = [
                (col::stock::QUANTITY, int(left)),
                (col::stock::YTD, int(int_of(&s_row, col::stock::YTD) + q)),
                (
                    col::stock::ORDER_CNT,
                    int(int_of(&s_row, col::stock::ORDER_CNT) + 1),
                ),
                (
                    col::stock::REMOTE_CNT,
                    int(int_of(&s_row, col::stock::REMOTE_CNT) + remote),
                ),
            ];
            drop(s_row);
            set(txn, stock, &s_key, changes)?;
            let amount = i128::from(q) * price;
            sum += amount;
            txn.insert(
                order_line,
                vec![
                    int(o_id),
                    int(d),
                    int(w),
                    int(n as i64 + 1),
                    int(i),
                    int(s),
                    Value::Null,
                    int(q),
                    Value::Decimal(amount),
                    dist_info,
                ],
            )?;
        }
        // sum(ol_amount) * (1 - c_discount) * (1 + w_tax + d_tax): cents times two
        // factors of scale 4, rounded back to cents.
        let factor = (10_000 - dec_of(&c_row, col::customer::DISCOUNT)) * (10_000 + w_tax + d_tax);
        let total = (sum * factor + 50_000_000) / 100_000_000;
        Ok(vec![vec![
            int(o_id),
            int(lines as i64),
            Value::Decimal(total),
            c_row[col::customer::LAST].clone(),
            c_row[col::customer::CREDIT].clone(),
        ]])
    }
}
