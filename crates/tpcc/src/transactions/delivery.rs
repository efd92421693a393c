//! Delivery (clause 2.7): deliver each district's oldest undelivered order.

use super::{get, with};
use crate::load::DISTRICTS;
use crate::schema::{TIMESTAMP, col};
use crate::values::{dec_of, int, int_of, ints};
use gyre_replica::{Column, ColumnType, Procedure, Result, Txn, Value};

/// `tpcc_delivery(w_id, o_carrier_id, ol_delivery_d)`: one row (d_id, o_id) per district
/// that had an order to deliver. Run at once, as one transaction for the ten districts
/// (the specification allows deferring it; the terminal here waits).
pub struct Delivery;

impl Procedure for Delivery {
    fn name(&self) -> &str {
        "tpcc_delivery"
    }

    fn params(&self) -> Vec<Column> {
        vec![
            Column::new("w_id", ColumnType::Int32, false),
            Column::new("o_carrier_id", ColumnType::Int32, false),
            Column::new("ol_delivery_d", TIMESTAMP, false),
        ]
    }

    fn returns(&self) -> Vec<Column> {
        vec![
            Column::new("d_id", ColumnType::Int32, false),
            Column::new("o_id", ColumnType::Int32, false),
        ]
    }

    fn run(&self, txn: &mut Txn<'_>, args: &[Value]) -> Result<Vec<Vec<Value>>> {
        let [w, carrier] = ints(args);
        let delivery_d = args[2].clone();
        let new_order = txn.table("new_order")?;
        let orders = txn.table("orders")?;
        let order_line = txn.table("order_line")?;
        let customer = txn.table("customer")?;
        let mut delivered = vec![];
        for d in 1..=DISTRICTS {
            let Some(o_id) = txn
                .prefix(new_order, &[int(w), int(d)])?
                .next()
                .map(|(_, r)| int_of(r, col::new_order::O_ID))
            else {
                continue;
            };
            txn.delete(new_order, &[int(w), int(d), int(o_id)])?;
            let o_row = get(txn, orders, &[int(w), int(d), int(o_id)], "order")?;
            txn.update(
                orders,
                with(&o_row, [(col::orders::CARRIER_ID, int(carrier))]),
            )?;
            let lines: Vec<_> = txn
                .prefix(order_line, &[int(w), int(d), int(o_id)])?
                .map(|(_, r)| r.clone())
                .collect();
            let mut sum = 0;
            for l in lines {
                sum += dec_of(&l, col::order_line::AMOUNT);
                txn.update(
                    order_line,
                    with(&l, [(col::order_line::DELIVERY_D, delivery_d.clone())]),
                )?;
            }
            let c_id = int_of(&o_row, col::orders::C_ID);
            let c_row = get(txn, customer, &[int(w), int(d), int(c_id)], "customer")?;
            txn.update(
                customer,
                with(
                    &c_row,
                    [
                        (
                            col::customer::BALANCE,
                            Value::Decimal(dec_of(&c_row, col::customer::BALANCE) + sum),
                        ),
                        (
                            col::customer::DELIVERY_CNT,
                            int(int_of(&c_row, col::customer::DELIVERY_CNT) + 1),
                        ),
                    ],
                ),
            )?;
            delivered.push(vec![int(d), int(o_id)]);
        }
        Ok(delivered)
    }
}
