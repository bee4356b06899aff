"""The filter language: NGSI v2 q / mq and the SilboPS string operators."""
